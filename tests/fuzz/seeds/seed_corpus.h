// The command line of a seed generator: one argument, the corpus directory it fills.
#pragma once
#include <cstdio>
#include <filesystem>
#include <optional>

// The corpus directory, created; nullopt (after a usage line on stderr) when the arguments are not one path.
inline std::optional<std::filesystem::path> corpus_dir(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return std::nullopt;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  return dir;
}
