// tfe.Reference: the CPU reference (<tfe/reference.h>).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <tfe/reference.h>

#include "arrays.h"
#include "binding.h"

using namespace nb::literals;

namespace tfe::py {

namespace {

struct PyReference {
  std::shared_ptr<const tfe::HeadFile> file;  // the reference reads its weights in place
  std::unique_ptr<tfe::Reference> ref;
  std::mutex mu;
};

}  // namespace

void bind_reference(nb::module_& m) {
  nb::class_<PyReference>(m, "Reference", "The CPU reference: what the kernels must compute, slot state included.")
      .def(
          "__init__",
          [](PyReference* self, nb::handle head, nb::handle max_slots, nb::handle max_steps, nb::handle fp8,
             nb::handle threads, nb::handle cand_k, nb::handle check_taps) {
            tfe::ReferenceOptions o;
            o.max_slots = as_int32(max_slots, "max_slots");
            o.max_steps = as_int32(max_steps, "max_steps");
            o.fp8 = as_fp8(fp8, "fp8");
            o.threads = as_int32(threads, "threads");
            o.cand_k = as_int32(cand_k, "cand_k");
            o.check_taps = as_bool(check_taps, "check_taps");
            // Before the head is read and anything is allocated (max_slots sizes every slot's state).
            tfe::validate(o);
            auto file = head_arg(head, "head", false);
            auto ref = std::make_unique<tfe::Reference>(*file, o);
            new (self) PyReference{std::move(file), std::move(ref), {}};
          },
          "head"_a.none(), nb::kw_only(), "max_slots"_a.none() = 16, "max_steps"_a.none() = 8, "fp8"_a.none() = "auto",
          "threads"_a.none() = 0, "cand_k"_a.none() = 0, "check_taps"_a.none() = false,
          nb::sig("def __init__(self, head: str | os.PathLike[str] | HeadFile, *, max_slots: int = 16, "
                  "max_steps: int = 8, fp8: str = 'auto', threads: int = 0, cand_k: int = 0, "
                  "check_taps: bool = False) -> None"))
      .def(
          "extend",
          [](PyReference& r, nb::handle a, nb::handle first_pos, nb::handle taps, nb::handle tokens) {
            std::vector<Array> arrays;
            const auto requests = one_form<tfe::ExtendRequest>(
                extend_args(a, first_pos, taps, tokens, row_width(r.ref->header()), arrays));
            nb::gil_scoped_release release;
            const std::lock_guard lock(r.mu);
            r.ref->extend(requests);
          },
          "requests"_a.none(), "first_pos"_a.none() = nb::none(), "taps"_a.none() = nb::none(),
          "tokens"_a.none() = nb::none(),
          nb::sig("def extend(self, requests: int | Sequence[tuple[int, int, object, object]], first_pos: int | None "
                  "= None, taps: object = None, tokens: object = None) -> None"),
          "Absorbs real rows: extend(slot, first_pos, taps, tokens), or extend([(slot, first_pos, taps, tokens),\n"
          "...]) for several slots. taps [rows, taps * target_hidden] bfloat16 (numpy: uint16 bits), tokens [rows]\n"
          "int32. first_pos: the slot's next position (an empty slot starts anywhere). Drafted rows are not kept.")
      .def(
          "extend_batch",
          [](PyReference& r, nb::handle slots, nb::handle first_pos, nb::handle counts, nb::handle taps,
             nb::handle tokens, nb::handle starts) {
            std::vector<Array> arrays;
            const auto requests = one_form<tfe::ExtendRequest>(
                check_batch(slots, first_pos, counts, taps, tokens, starts, row_width(r.ref->header()), arrays));
            nb::gil_scoped_release release;
            const std::lock_guard lock(r.mu);
            r.ref->extend(requests);
          },
          "slots"_a.none(), "first_pos"_a.none(), "counts"_a.none(), "taps"_a.none(), "tokens"_a.none(), nb::kw_only(),
          "starts"_a.none() = nb::none(),
          nb::sig("def extend_batch(self, slots: Sequence[int] | object, first_pos: Sequence[int] | object, "
                  "counts: Sequence[int] | object, taps: object, tokens: object, *, "
                  "starts: Sequence[int] | None = None) -> None"),
          "extend for several slots from one pair of host arrays: request i is slots[i] at first_pos[i], taking\n"
          "counts[i] rows from row starts[i] (default: right after the previous request's rows).")
      .def(
          "draft",
          [](PyReference& r, nb::handle slots, nb::handle steps, nb::handle first_ranks) {
            const std::vector<int> s = check_slots(slots);
            const int n = as_int32(steps, "steps");
            const std::vector<int> ranks = host_first_ranks(first_ranks, "draft");
            tfe::DraftResult d;
            {
              nb::gil_scoped_release release;
              const std::lock_guard lock(r.mu);
              d = r.ref->draft(s, n, ranks);
            }
            return draft_result(std::move(d));
          },
          "slots"_a.none(), "steps"_a.none(), nb::kw_only(), "first_ranks"_a.none() = nb::none(),
          nb::sig("def draft(self, slots: Sequence[int] | object, steps: int, *, "
                  "first_ranks: Sequence[int] | None = None) -> DraftResult"),
          "Drafts `steps` tokens (1..max_steps) after each slot's last row: (tokens, confidences), numpy\n"
          "[slots, steps] int32 and float32. The slots keep their rows: the next extend continues them.\n"
          "first_ranks: per slot, the rank of step 1's token (0: the best .. 7; a dense head's), the branches\n"
          "of a draft tree.")
      .def(
          "reset",
          [](PyReference& r, nb::handle slot) {
            const int s = as_int32(slot, "slot");
            const std::lock_guard lock(r.mu);
            r.ref->reset(s);
          },
          "slot"_a.none(), nb::sig("def reset(self, slot: int) -> None"),
          "Empties the slot: its next extend starts a new sequence.")
      .def_prop_ro("header", [](const PyReference& r) { return header_dict(r.ref->header()); })
      .def_prop_ro("ring_rows", [](const PyReference& r) { return r.ref->ring_rows(); })
      .def_prop_ro("max_slots", [](const PyReference& r) { return r.ref->options().max_slots; })
      .def_prop_ro("max_steps", [](const PyReference& r) { return r.ref->options().max_steps; })
      .def_prop_ro("fp8", [](const PyReference& r) { return std::string(tfe::fp8_mode_name(r.ref->options().fp8)); })
      .def(
          "uses_fp8", [](const PyReference& r, const std::string& linear) { return r.ref->uses_fp8(linear); },
          "linear"_a);
}

}  // namespace tfe::py
