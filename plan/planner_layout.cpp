// The planner's layout (plan/planner.h): the weights, in the tiled layout where only GEMVs read them, the
// device arena and the host arena.
#include <algorithm>

#include "plan/planner.h"
#include "kernels/weight_layout.h"

namespace tfe::planning {

Buffer& Planner::add(Arena& arena, std::string name, BufferRole role, DType dtype, std::vector<int64_t> shape,
                     std::vector<std::string> from) {
  Buffer b;
  b.bytes = checked_product(fmt::format("buffer `{}`", name), shape, dtype_size(dtype));
  b.name = std::move(name);
  b.role = role;
  b.dtype = dtype;
  b.shape = std::move(shape);
  b.alignment = kAlign;
  b.offset = align_up(arena.bytes, kAlign);
  b.from = std::move(from);
  if (b.offset > kMaxBytes - b.bytes) fail("plan: the arena holding `{}` exceeds {} bytes", b.name, kMaxBytes);
  arena.bytes = b.offset + b.bytes;
  arena.buffers.push_back(std::move(b));
  return arena.buffers.back();
}

// A weight matrix made of file linears concatenated along dim 0, in its chosen form.
Matrix Planner::add_matrix(const std::string& name, const std::vector<std::string>& parts, bool fp8) {
  Matrix m{name, fp8, 0, linear_shape(h(), parts.front())[1]};
  std::vector<std::string> from, scales;
  for (const auto& l : parts) {
    m.n += linear_shape(h(), l)[0];
    from.push_back(fp8 ? l + ".fp8" : l);
    scales.push_back(l + ".scale");
  }
  m.tiled = tiled_form(m);
  add(p_.weights, name, BufferRole::weight, fp8 ? DType::F8_E4M3 : DType::BF16, {m.n, m.k}, from).layout =
      m.tiled ? Layout::tiled : Layout::rows;
  if (fp8) add(p_.weights, name + ".scale", BufferRole::weight, DType::F32, {m.n}, scales);
  matrices_[name] = m;
  return m;
}

// Whether matrix m is stored tiled (kernels/weight_layout.h): where every node that reads it is a GEMV, each
// reading whole 16-row tiles, and its shape has whole tiles and K steps. The readers are known by name:
// in bf16 the extend's fc and K/V GEMMs are cuBLASLt's (row-major): fc is read there alone, and a tiled
// bf16 wqkv gets wkv, a row-major copy of its wk|wv rows, for the extend. target_head's rows are read one
// by one by rescore. FP8's extend reads wqkv's wk|wv slice through the GEMV, from row heads x head_dim;
// w_gate_up's up half starts at row n / 2.
bool Planner::tiled_form(const Matrix& m) {
  const auto& hh = h();
  const int64_t row_bytes = m.k * (m.fp8 ? 1 : 2);
  std::string why;
  if (!p_.tuning.tiled_weights)
    why = "tuning tiled_weights = false";
  else if (m.name == "target_head")
    why = "rescore reads its candidate rows one by one";
  else if (!m.fp8 && (m.name == "fc" || m.name == "wkv"))
    why = "the extend's cuBLASLt GEMM reads it row-major";
  else if (!tileable(m.n, row_bytes))
    why = fmt::format("{} rows of {} bytes are not whole tiles of {} rows and {}-byte K steps", m.n, row_bytes,
                      kTileRows, kTileStepBytes);
  else if (m.fp8 && m.name == "wqkv" && (hh.heads * hh.head_dim) % kTileRows != 0)
    why = fmt::format("the extend's wk|wv slice starts at row {}, inside a tile", hh.heads * hh.head_dim);
  else if (m.name == "w_gate_up" && (m.n / 2) % kTileRows != 0)
    why = fmt::format("the up half starts at row {}, inside a tile", m.n / 2);
  (why.empty() ? tiled_ : rows_).push_back(why.empty() ? m.name : fmt::format("{} ({})", m.name, why));
  return why.empty();
}

void Planner::add_vector(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  add(p_.weights, name, BufferRole::weight, dtype, std::move(shape), {name});
}

void Planner::lay_out_weights() {
  const auto& hh = h();
  const int64_t H = hh.hidden;
  add_matrix("fc", {"fc"}, fp8_["fc"]);
  for (size_t i = 0; i < hh.taps.size(); ++i)
    if (hh.taps[i].norm) add_vector("tap_norm." + std::to_string(i), DType::BF16, {hh.target_hidden});
  add_vector("embed", DType::BF16, {hh.vocab, H});
  add_vector("input_norm", DType::BF16, {H});
  add_vector("hidden_norm", DType::BF16, {H});
  const Matrix wqkv = add_matrix("wqkv", {"wq", "wk", "wv"}, fused_fp8_["wqkv"]);
  if (!wqkv.fp8 && wqkv.tiled) add_matrix("wkv", {"wk", "wv"}, false);  // the extend's, row-major
  if (hh.qk_norm) {
    add_vector("q_norm", DType::BF16, {hh.head_dim});
    add_vector("k_norm", DType::BF16, {hh.head_dim});
  }
  add_matrix("wo", {"wo"}, fp8_["wo"]);
  add_vector("post_norm", DType::BF16, {H});
  add_matrix("w_gate_up", {"w_gate", "w_up"}, fused_fp8_["w_gate_up"]);
  add_matrix("w_down", {"w_down"}, fp8_["w_down"]);
  add_vector("final_norm", DType::BF16, {H});
  add_vector("d2t", DType::I32, {hh.draft_vocab});
  if (hh.head_type == HeadType::dense) {
    add_matrix("lm_head", {"lm_head"}, fp8_["lm_head"]);
  } else {
    add_matrix("lr_a", {"lr_a"}, fp8_["lr_a"]);
    add_matrix("lr_b", {"lr_b"}, fp8_["lr_b"]);
    add_matrix("target_head", {"target_head"}, fp8_["target_head"]);
  }
  add(p_.weights, "rope_inv_freq", BufferRole::weight, DType::F32, {hh.head_dim / 2}, {"computed:rope_inv_freq"});
}

void Planner::lay_out_arena() {
  const auto& hh = h();
  const auto& o = p_.options;
  const int64_t H = hh.hidden, slots = o.max_slots + 1, B = o.buckets.back(), E = o.extend_rows;
  const int64_t kv_width = hh.kv_heads * hh.head_dim, q_width = hh.heads * hh.head_dim;
  Arena& a = p_.arena;
  add(a, "ring_k", BufferRole::state, DType::BF16, {slots, p_.ring_rows, hh.kv_heads, hh.head_dim});
  add(a, "ring_v", BufferRole::state, DType::BF16, {slots, p_.ring_rows, hh.kv_heads, hh.head_dim});
  add(a, "slot_g", BufferRole::state, DType::BF16, {slots, H});
  // A slot's last real position, the first of its sequence, its last token and whether it holds one: what
  // a draft pass starts from, kept on the device by the extend pass (keep_state).
  add(a, "slot_state", BufferRole::state, DType::I32, {slots, kc::kSlotStateColumns});
  // An enqueued draft's slot ids, from the caller's stream (load_tables reads them).
  add(a, "draft_slots", BufferRole::input, DType::I32, {B});
  // ... and, with first_ranks, each row's rank for step 1.
  if (o.first_ranks) add(a, "draft_ranks", BufferRole::input, DType::I32, {B});
  // The tables region: what an extend chunk uploads, in one copy. Rows from device memory upload the
  // addresses of their taps and token (row_taps_src, row_tok_src), and the chunk's first node
  // (gather_taps) fills `taps` and `row_tok` from them; host rows upload `taps` and `row_tok` themselves.
  p_.tables_offset = align_up(a.bytes, kAlign);
  for (auto t : {"row_slot", "row_pos", "row_tok"}) add(a, t, BufferRole::table, DType::I32, {E});
  for (auto t : {"row_taps_src", "row_tok_src"}) add(a, t, BufferRole::table, DType::I64, {E});
  for (auto t : {"last_row", "last_slot", "last_first"})
    add(a, t, BufferRole::table, DType::I32, {int64_t{o.max_slots}});
  add(a, "taps", BufferRole::table, DType::BF16, {E, static_cast<int64_t>(hh.taps.size()) * hh.target_hidden});
  p_.tables_bytes = a.bytes - p_.tables_offset;
  // Draft activations, for the largest bucket; each name is one value of the step. The draft's tables
  // first: the pass's first node (load_tables) fills them from the slot ids and slot_state.
  for (auto t : {"slot", "pos", "first_pos", "tok"}) add(a, t, BufferRole::activation, DType::I32, {B});
  if (o.first_ranks) add(a, "rank", BufferRole::activation, DType::I32, {B});
  add(a, "g", BufferRole::activation, DType::BF16, {B, H});
  add(a, "x", BufferRole::activation, DType::BF16, {B, 2 * H});
  if (!rope_in_wqkv()) add(a, "qkv", BufferRole::activation, DType::BF16, {B, q_width + 2 * kv_width});
  add(a, "q", BufferRole::activation, DType::BF16, {B, q_width});
  add(a, "o", BufferRole::activation, DType::BF16, {B, q_width});
  add(a, "h1", BufferRole::activation, DType::BF16, {B, H});
  add(a, "post", BufferRole::activation, DType::BF16, {B, H});
  add(a, "m", BufferRole::activation, DType::BF16, {B, hh.ffn});
  add(a, "h2", BufferRole::activation, DType::BF16, {B, H});
  add(a, "n", BufferRole::activation, DType::BF16, {B, H});
  if (hh.head_type == HeadType::dense) {
    // The lm_head gemv writes no logits: per row, one 16-byte record {max, lowest index at it (int32
    // bits), sum exp(l - max), 0} for each of its CTAs, which top1 joins. Sized for the most CTAs per row
    // over the buckets; a pass indexes the records by its own PARTS.
    int64_t parts = 0;
    for (int b : o.buckets) parts = std::max(parts, top1_parts(b));
    add(a, "top1_part", BufferRole::activation, DType::F32, {B, parts, kc::kTop1PartBytes / 4});
    // With first_ranks, step 1's lm_head writes its logits whole, for ranked.
    if (o.first_ranks) add(a, "logits", BufferRole::activation, DType::F32, {B, hh.draft_vocab});
  } else {
    add(a, "u", BufferRole::activation, DType::BF16, {B, hh.lowrank});
    add(a, "scores", BufferRole::activation, DType::F32, {B, hh.draft_vocab});
    add(a, "cand", BufferRole::activation, DType::I32, {B, cand_k_});
    add(a, "exact", BufferRole::activation, DType::F32, {B, cand_k_});
    // rescore's per-row tickets: zero at open, and every pass returns them to zero.
    add(a, "rescore_arrivals", BufferRole::activation, DType::I32, {B});
  }
  add(a, "next_token", BufferRole::activation, DType::I32, {B});
  // Extend activations, for one chunk.
  add(a, "e_g", BufferRole::activation, DType::BF16, {E, H});
  add(a, "e_x", BufferRole::activation, DType::BF16, {E, 2 * H});
  add(a, "e_kv", BufferRole::activation, DType::BF16, {E, 2 * kv_width});
  add(a, "out_token", BufferRole::output, DType::I32, {B, int64_t{o.max_steps}});
  add(a, "out_conf", BufferRole::output, DType::F32, {B, int64_t{o.max_steps}});
}

// Mapped pinned host memory (Plan::host): a blocking draft's slot ids as the host writes them
// (host_tables, and with first_ranks the rows' ranks in host_ranks), the copy of its outputs that store_outputs writes
// for the host to read, the word store_outputs sets last, which the host polls (host_done), and the record a kernel
// leaves when device input the host never saw was bad (host_error).
void Planner::lay_out_host() {
  const auto& o = p_.options;
  const int64_t B = o.buckets.back();
  add(p_.host, "host_tables", BufferRole::host, DType::I32, {B});
  if (o.first_ranks) add(p_.host, "host_ranks", BufferRole::host, DType::I32, {B});
  add(p_.host, "host_token", BufferRole::host, DType::I32, {B, int64_t{o.max_steps}});
  add(p_.host, "host_conf", BufferRole::host, DType::F32, {B, int64_t{o.max_steps}});
  add(p_.host, "host_done", BufferRole::host, DType::I32, {1});
  add(p_.host, "host_error", BufferRole::host, DType::I64, {1});
}

}  // namespace tfe::planning
