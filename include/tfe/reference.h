// The CPU reference of a draft head: extend and draft exactly as docs/head.md states them, op by op
// through reference/ops.h (tfe::reference implements it). It defines the expected bits of every GPU
// output (up to the order of sums) and keeps the same per-slot state as the GPU runtime: a K/V ring of
// ring_rows(W, max_steps) rows, and the last real row's g and token, with the same SlotTable checks.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <tfe/draft.h>
#include <tfe/head_file.h>
#include <tfe/options.h>
#include <tfe/slots.h>

namespace tfe {

namespace ref {
struct Linear;  // reference/ops.h
}

struct ReferenceOptions {
  int max_slots = 16;
  int max_steps = 8;  // 1..16, as the planner allows
  Fp8Mode fp8 = Fp8Mode::automatic;
  int threads = 0;          // linears split over output rows; 0: hardware threads. Results do not depend on it.
  int cand_k = 0;           // two_stage: the candidates rescored per row; 0: the header's (as PlanOptions::cand_k)
  bool check_taps = false;  // refuse NaN or infinite taps (check_finite_taps); off costs nothing
};

// Refuses, naming the field, the value and the limit: max_slots outside 1..4096, max_steps outside 1..16,
// threads outside 0..1024. The constructor checks the same; a caller checks before it reads a head.
void validate(const ReferenceOptions& options);

// What extend computed for each row, in request order (rows of all requests concatenated).
struct ExtendTrace {
  int64_t rows = 0;
  std::vector<bf16_bits> taps;  // [rows, T*Ht] after the tap norms
  std::vector<bf16_bits> g;     // [rows, H]
  std::vector<bf16_bits> x;     // [rows, 2H]
  std::vector<bf16_bits> k;     // [rows, nkv*hd] as written to the ring (qk_norm, RoPE)
  std::vector<bf16_bits> v;     // [rows, nkv*hd]
};

// Every intermediate of one row (one slot) in one draft step; bf16 unless said.
struct StepTrace {
  int32_t position = 0;
  int32_t key_begin = 0;                      // keys attended: positions key_begin .. position
  std::vector<bf16_bits> g;                   // [H]: the row's g (the real row's, or h2 of the step before)
  std::vector<bf16_bits> x;                   // [2H]
  std::vector<bf16_bits> q, k, v;             // [nh*hd], [nkv*hd], [nkv*hd]: the linears' outputs
  std::vector<bf16_bits> q_normed, k_normed;  // after qk_norm (empty when the head has none)
  std::vector<bf16_bits> q_rot, k_rot;        // after RoPE (k_rot is what the ring holds)
  std::vector<bf16_bits> o;                   // [nh*hd]
  std::vector<bf16_bits> h1;                  // [H]
  std::vector<bf16_bits> post;                // [H]: rms_post(h1)
  std::vector<bf16_bits> gate, up;            // [F]
  std::vector<bf16_bits> m;                   // [F]: SwiGLU product
  std::vector<bf16_bits> h2;                  // [H]
  std::vector<bf16_bits> n;                   // [H]: rms_final(h2)
  std::vector<float> logits;                  // dense: [Vd] fp32
  std::vector<bf16_bits> lowrank;             // two_stage: [r] = bf16(lr_a n)
  std::vector<float> scores;                  // two_stage: [Vd] fp32 = lr_b lowrank
  std::vector<int32_t> candidates;            // two_stage: [cand_k] draft ids, best score first
  std::vector<float> exact;                   // two_stage: [cand_k] fp32 exact logits of the candidates
  int32_t draft_id = 0;                       // in the draft vocabulary
  int32_t token = 0;                          // target id handed out
  float confidence = 0.0f;
};

struct DraftTrace {
  int streams = 0;
  int steps = 0;
  std::vector<StepTrace> rows;  // [steps][streams]
  const StepTrace& at(int stream, int step) const { return rows[static_cast<size_t>(step - 1) * streams + stream]; }
};

class Reference {
 public:
  // Reads its weights in place from `file`, which must outlive the Reference. Throws naming the linear
  // when options.fp8 is `require` and the file lacks that linear's FP8 form, or an option out of range.
  Reference(const HeadFile& file, const ReferenceOptions& options);
  Reference(Reference&&) noexcept;
  ~Reference();

  const HeadHeader& header() const { return header_; }
  const ReferenceOptions& options() const { return options_; }
  int ring_rows() const { return ring_rows_; }
  const SlotTable& slots() const { return slots_; }
  // Whether `linear` runs in its FP8 form under the chosen mode.
  bool uses_fp8(std::string_view linear) const;

  // Absorbs real rows. Every request is checked (SlotTable::check_extend, sizes, one request per slot)
  // before any state changes.
  void extend(std::span<const ExtendRequest> requests, ExtendTrace* trace = nullptr);
  // Drafts `steps` tokens for each slot. Writes the draft rows' K/V into the rings (overwritten by the
  // next extend); slots' real state is unchanged.
  DraftResult draft(std::span<const int> slots, int steps, DraftTrace* trace = nullptr);
  // The same, step 1 taking for slots[i] the token of rank first_ranks[i] (0 .. kMaxFirstRank, below the
  // draft vocabulary; a dense head's alone): the branches of a draft tree. Empty: every slot's best.
  DraftResult draft(std::span<const int> slots, int steps, std::span<const int> first_ranks,
                    DraftTrace* trace = nullptr);
  void reset(int slot);

  // A slot's ring [R, nkv, hd], row = position mod R; zeros where nothing was written.
  std::span<const bf16_bits> ring_k(int slot) const;
  std::span<const bf16_bits> ring_v(int slot) const;
  // g of the slot's last real row [H].
  std::span<const bf16_bits> last_g(int slot) const;

 private:
  struct Slot {
    std::vector<bf16_bits> k, v;  // [R, nkv, hd], allocated at the slot's first extend
    std::vector<bf16_bits> g;     // [H]
  };
  const ref::Linear& linear(std::string_view name) const;
  std::span<const bf16_bits> norm(std::string_view name) const;
  // x = concat(rms_in(embed[tok]), rms_hidden(g)) for each row.
  std::vector<bf16_bits> layer_input(std::span<const int32_t> tokens, std::span<const bf16_bits> g) const;
  // qk_norm (when set) and RoPE of the rows' q or k heads, each row at its own position.
  void position_heads(std::vector<bf16_bits>& heads, int64_t n_heads, std::span<const int32_t> positions,
                      std::string_view norm_name, std::vector<bf16_bits>* normed) const;
  void write_ring(int slot, int32_t pos, const bf16_bits* k, const bf16_bits* v);

  const HeadFile& file_;
  HeadHeader header_;
  ReferenceOptions options_;
  int threads_ = 1;
  int cand_k_ = 0;  // two_stage: candidates rescored per row (ReferenceOptions::cand_k, else the header's)
  int ring_rows_ = 0;
  std::vector<ref::Linear> linears_;
  std::vector<float> inv_freq_;
  SlotTable slots_;
  std::vector<Slot> state_;
};

}  // namespace tfe
