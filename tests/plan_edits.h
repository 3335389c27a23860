// Helpers for the tests that edit a valid plan and expect validate() to refuse it by name.
#pragma once
#include <doctest/doctest.h>

#include <functional>
#include <stdexcept>
#include <string_view>

#include "core/error.h"
#include "plan/plan.h"

namespace tfe::test {

// The first node named `name` in the plan's largest bucket, else in its extend.
inline Node& plan_node(Plan& p, std::string_view name) {
  for (auto* nodes : {&p.buckets.back().nodes, &p.extend})
    for (Node& n : *nodes)
      if (n.name == name) return n;
  FAIL("no node " << name);
  throw std::logic_error("unreachable");
}

// Node n's argument `param`.
inline Arg& node_arg(Node& n, std::string_view param) {
  for (Arg& a : n.args)
    if (a.param == param) return a;
  FAIL("no argument " << param);
  throw std::logic_error("unreachable");
}

// Checks that validate() refuses `good` after `edit` with an Error whose message holds `message`.
inline void check_refused(const Plan& good, const char* what, const std::function<void(Plan&)>& edit,
                          const char* message) {
  CAPTURE(what);
  Plan p = good;
  edit(p);
  CHECK_THROWS_WITH_AS(validate(p), doctest::Contains(message), Error);
}

}  // namespace tfe::test
