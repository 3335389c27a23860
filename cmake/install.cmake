# `cmake --install`: the libraries, the public headers (include/tfe/), tfe-plan and a CMake package, so
# that an engine's project does find_package(tfe) and links tfe::runtime.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TFE_INSTALLED_LIBRARIES tfe_core tfe_head tfe_kernels tfe_plan tfe_compiler tfe_reference tfe_device
                            tfe_graphs tfe_runtime)
if(TFE_HAVE_NCCL)
  list(APPEND TFE_INSTALLED_LIBRARIES tfe_distributed)
endif()
install(TARGETS ${TFE_INSTALLED_LIBRARIES} EXPORT tfeTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS tfe-plan RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tfe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT tfeTargets NAMESPACE tfe:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tfe)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/tfeConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/tfeConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tfe)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tfeConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tfeConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/tfeConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tfe)
