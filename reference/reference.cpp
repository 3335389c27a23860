#include <tfe/reference.h>

#include <algorithm>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/limits.h"
#include "core/extend_check.h"
#include "head/numerics.h"
#include "reference/ops.h"
#include "reference/parallel.h"

namespace tfe {

namespace {

// Largest max_steps the planner accepts (<tfe/options.h>, PlanOptions::max_steps).
constexpr int kMaxSteps = 16;

SlotLimits slot_limits(const HeadHeader& h, const ReferenceOptions& o) {
  validate(o);  // before the slot table and the per-slot state are allocated
  SlotLimits l;
  l.max_slots = o.max_slots;
  l.ring_rows = ring_rows(h.window, o.max_steps);
  l.vocab = h.vocab;
  l.max_steps = o.max_steps;
  l.max_streams = o.max_slots;  // the reference has no buckets: any set of distinct slots drafts at once
  l.window = h.window;
  return l;
}

template <typename T>
std::span<const T> row(std::span<const T> all, int64_t i, int64_t width) {
  return all.subspan(static_cast<size_t>(i * width), static_cast<size_t>(width));
}
template <typename T>
std::span<T> row(std::vector<T>& all, int64_t i, int64_t width) {
  return std::span<T>(all).subspan(static_cast<size_t>(i * width), static_cast<size_t>(width));
}

}  // namespace

void validate(const ReferenceOptions& o) {
  if (o.max_slots < 1 || o.max_slots > kMaxSlots) fail("max_slots: {} is outside 1..{}", o.max_slots, kMaxSlots);
  if (o.max_steps < 1 || o.max_steps > kMaxSteps) fail("max_steps: {} is outside 1..{}", o.max_steps, kMaxSteps);
  check_threads(o.threads, "Reference");
}

Reference::Reference(Reference&&) noexcept = default;
Reference::~Reference() = default;

Reference::Reference(const HeadFile& file, const ReferenceOptions& options)
    : file_(file),
      header_(file.header()),
      options_(options),
      threads_(ref::resolve_threads(options.threads)),
      cand_k_(rescored_candidates(file.header(), options.cand_k)),
      ring_rows_(tfe::ring_rows(header_.window, options.max_steps)),
      slots_(slot_limits(header_, options)) {
  for (const auto& name : linears_in_use(header_)) {
    const auto shape = linear_shape(header_, name);
    const bool fp8 = options.fp8 != Fp8Mode::off && header_.has_fp8(name);
    if (options.fp8 == Fp8Mode::require && !fp8)
      fail("fp8 = require: linear `{}` has no FP8 form in the head file (the file has: {})", name,
           header_.fp8.empty() ? std::string("none") : fmt::format("{}", fmt::join(header_.fp8, ", ")));
    if (fp8) {
      linears_.push_back(ref::Linear::fp8(name, file.tensor(name + ".fp8").as<uint8_t>(),
                                          file.tensor(name + ".scale").as<float>(), shape[0], shape[1]));
    } else {
      linears_.push_back(ref::Linear::bf16(name, file.tensor(name).as<bf16_bits>(), shape[0], shape[1]));
    }
  }
  // The reader checks d2t too; the reference indexes embed and target_head by it, so it checks again.
  const auto d2t = file.tensor("d2t").as<int32_t>();
  for (size_t i = 0; i < d2t.size(); ++i) {
    const int64_t target = static_cast<int64_t>(i) + d2t[i];
    if (target < 0 || target >= header_.vocab)
      fail("d2t[{}] = {} maps draft id {} to target id {}, outside [0, {})", i, d2t[i], i, target, header_.vocab);
  }
  inv_freq_ = rope_inv_freq(header_);
  state_.resize(static_cast<size_t>(options.max_slots));
}

bool Reference::uses_fp8(std::string_view name) const { return linear(name).is_fp8(); }

const ref::Linear& Reference::linear(std::string_view name) const {
  for (const auto& l : linears_)
    if (l.name == name) return l;
  fail("reference: `{}` is not a linear of this {} head", name, head_type_name(header_.head_type));
}

std::span<const bf16_bits> Reference::norm(std::string_view name) const { return file_.tensor(name).as<bf16_bits>(); }

std::vector<bf16_bits> Reference::layer_input(std::span<const int32_t> tokens, std::span<const bf16_bits> g) const {
  const int64_t H = header_.hidden, rows = static_cast<int64_t>(tokens.size());
  const auto embed = file_.tensor("embed").as<bf16_bits>();
  const auto in_w = norm("input_norm"), hidden_w = norm("hidden_norm");
  std::vector<bf16_bits> x(static_cast<size_t>(rows * 2 * H));
  for (int64_t r = 0; r < rows; ++r) {
    auto xr = row(x, r, 2 * H);
    ref::rmsnorm(row(embed, tokens[static_cast<size_t>(r)], H), in_w, header_.rms_eps, xr.first(H));
    ref::rmsnorm(row(g, r, H), hidden_w, header_.rms_eps, xr.last(H));
  }
  return x;
}

void Reference::position_heads(std::vector<bf16_bits>& heads, int64_t n_heads, std::span<const int32_t> positions,
                               std::string_view norm_name, std::vector<bf16_bits>* normed) const {
  const int64_t hd = header_.head_dim, width = n_heads * hd;
  if (header_.qk_norm) {
    std::vector<bf16_bits> out(heads.size());
    ref::rmsnorm(heads, norm(norm_name), header_.rms_eps, out);
    heads = std::move(out);
    if (normed) *normed = heads;
  }
  std::vector<bf16_bits> rotated(heads.size());
  for (size_t r = 0; r < positions.size(); ++r)
    ref::rope(row(std::span<const bf16_bits>(heads), static_cast<int64_t>(r), width), hd, positions[r], inv_freq_,
              row(rotated, static_cast<int64_t>(r), width));
  heads = std::move(rotated);
}

void Reference::write_ring(int slot, int32_t pos, const bf16_bits* k, const bf16_bits* v) {
  auto& s = state_[static_cast<size_t>(slot)];
  const size_t width = static_cast<size_t>(header_.kv_heads * header_.head_dim);
  if (s.k.empty()) {
    s.k.assign(static_cast<size_t>(ring_rows_) * width, 0);
    s.v.assign(static_cast<size_t>(ring_rows_) * width, 0);
  }
  const size_t at = static_cast<size_t>(tfe::ring_row(pos, ring_rows_)) * width;
  std::copy(k, k + width, s.k.begin() + static_cast<ptrdiff_t>(at));
  std::copy(v, v + width, s.v.begin() + static_cast<ptrdiff_t>(at));
}

void Reference::extend(std::span<const ExtendRequest> requests, ExtendTrace* trace) {
  const HeadHeader& h = header_;
  const int64_t T = static_cast<int64_t>(h.taps.size()), Ht = h.target_hidden, H = h.hidden;
  const int64_t kv_width = h.kv_heads * h.head_dim;
  check_extend_requests(slots_, requests, T * Ht);
  if (options_.check_taps) check_finite_taps(requests, T * Ht);
  int64_t rows = 0;
  for (const auto& r : requests) rows += r.n_rows;

  // All rows of all requests go through each linear together: the weights are read once.
  std::vector<bf16_bits> taps(static_cast<size_t>(rows * T * Ht));
  std::vector<int32_t> tokens(static_cast<size_t>(rows)), positions(static_cast<size_t>(rows));
  {
    int64_t at = 0;
    for (const auto& r : requests) {
      std::copy(r.taps.begin(), r.taps.end(), taps.begin() + at * T * Ht);
      std::copy(r.tokens.begin(), r.tokens.end(), tokens.begin() + at);
      for (int64_t i = 0; i < r.n_rows; ++i)
        positions[static_cast<size_t>(at + i)] = static_cast<int32_t>(r.first_pos + i);
      at += r.n_rows;
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    if (!h.taps[static_cast<size_t>(t)].norm) continue;
    const auto w = norm(fmt::format("tap_norm.{}", t));
    std::vector<bf16_bits> one(static_cast<size_t>(Ht));
    for (int64_t r = 0; r < rows; ++r) {
      auto tap = row(taps, r * T + t, Ht);
      ref::rmsnorm(tap, w, h.rms_eps, one);
      std::copy(one.begin(), one.end(), tap.begin());
    }
  }
  std::vector<bf16_bits> g(static_cast<size_t>(rows * H));
  ref::linear(linear("fc"), taps, g, threads_);
  const auto x = layer_input(tokens, g);
  std::vector<bf16_bits> k(static_cast<size_t>(rows * kv_width)), v(k.size());
  ref::linear(linear("wk"), x, k, threads_);
  ref::linear(linear("wv"), x, v, threads_);
  position_heads(k, h.kv_heads, positions, "k_norm", nullptr);

  int64_t at = 0;
  for (const auto& r : requests) {
    for (int64_t i = 0; i < r.n_rows; ++i)
      write_ring(r.slot, positions[static_cast<size_t>(at + i)], k.data() + (at + i) * kv_width,
                 v.data() + (at + i) * kv_width);
    const auto last = row(std::span<const bf16_bits>(g), at + r.n_rows - 1, H);
    state_[static_cast<size_t>(r.slot)].g.assign(last.begin(), last.end());
    slots_.commit_extend(r.slot, r.first_pos, r.n_rows, r.tokens);
    at += r.n_rows;
  }
  if (trace) *trace = ExtendTrace{rows, std::move(taps), std::move(g), x, std::move(k), std::move(v)};
}

DraftResult Reference::draft(std::span<const int> slot_ids, int steps, DraftTrace* trace) {
  return draft(slot_ids, steps, {}, trace);
}

DraftResult Reference::draft(std::span<const int> slot_ids, int steps, std::span<const int> first_ranks,
                             DraftTrace* trace) {
  slots_.check_draft(slot_ids, steps);
  const HeadHeader& h = header_;
  check_first_ranks("draft", first_ranks, slot_ids.size(), h);
  const int64_t B = static_cast<int64_t>(slot_ids.size()), H = h.hidden, hd = h.head_dim;
  const int64_t q_width = h.heads * hd, kv_width = h.kv_heads * hd, F = h.ffn, Vd = h.draft_vocab;
  const auto d2t = file_.tensor("d2t").as<int32_t>();
  const bool dense = h.head_type == HeadType::dense;

  DraftResult out;
  out.streams = static_cast<int>(B);
  out.steps = steps;
  out.width = H;
  out.tokens.resize(static_cast<size_t>(B * steps));
  out.confidences.resize(out.tokens.size());
  out.hidden.resize(out.tokens.size() * static_cast<size_t>(H));
  if (trace) *trace = DraftTrace{static_cast<int>(B), steps, std::vector<StepTrace>(static_cast<size_t>(B * steps))};

  // The step-1 row is the slot's last real row: its g and following token, at its position.
  std::vector<bf16_bits> g(static_cast<size_t>(B * H));
  std::vector<int32_t> tokens(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int slot = slot_ids[static_cast<size_t>(b)];
    const auto& sg = state_[static_cast<size_t>(slot)].g;
    std::copy(sg.begin(), sg.end(), g.begin() + b * H);
    tokens[static_cast<size_t>(b)] = slots_.last_token(slot);
  }

  for (int step = 1; step <= steps; ++step) {
    std::vector<int32_t> positions(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b)
      positions[static_cast<size_t>(b)] = slots_.last_pos(slot_ids[static_cast<size_t>(b)]) + (step - 1);
    StepTrace* tr = trace ? &trace->rows[static_cast<size_t>(step - 1) * B] : nullptr;

    const auto x = layer_input(tokens, g);
    std::vector<bf16_bits> q(static_cast<size_t>(B * q_width)), k(static_cast<size_t>(B * kv_width)), v(k.size());
    ref::linear(linear("wq"), x, q, threads_);
    ref::linear(linear("wk"), x, k, threads_);
    ref::linear(linear("wv"), x, v, threads_);
    std::vector<bf16_bits> q_raw, k_raw, q_normed, k_normed;
    if (tr) {
      q_raw = q;
      k_raw = k;
    }
    position_heads(q, h.heads, positions, "q_norm", tr ? &q_normed : nullptr);
    position_heads(k, h.kv_heads, positions, "k_norm", tr ? &k_normed : nullptr);

    std::vector<bf16_bits> o(static_cast<size_t>(B * q_width));
    std::vector<int32_t> key_begin(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const int slot = slot_ids[static_cast<size_t>(b)];
      const int32_t pos = positions[static_cast<size_t>(b)];
      write_ring(slot, pos, k.data() + b * kv_width, v.data() + b * kv_width);
      const int32_t begin = slots_.key_begin(slot, pos);
      key_begin[static_cast<size_t>(b)] = begin;
      const auto& s = state_[static_cast<size_t>(slot)];
      std::vector<bf16_bits> keys, values;
      for (int32_t p = begin; p <= pos; ++p) {
        const auto at = s.k.begin() + static_cast<ptrdiff_t>(tfe::ring_row(p, ring_rows_) * kv_width);
        keys.insert(keys.end(), at, at + kv_width);
        const auto vat = s.v.begin() + static_cast<ptrdiff_t>(tfe::ring_row(p, ring_rows_) * kv_width);
        values.insert(values.end(), vat, vat + kv_width);
      }
      ref::attention(row(std::span<const bf16_bits>(q), b, q_width), keys, values, h.heads, h.kv_heads, hd,
                     row(o, b, q_width));
    }

    std::vector<bf16_bits> h1(static_cast<size_t>(B * H)), post(h1.size()), h2(h1.size()), n(h1.size());
    ref::linear_residual(linear("wo"), o, g, h1, threads_);
    ref::rmsnorm(h1, norm("post_norm"), h.rms_eps, post);
    std::vector<bf16_bits> gate(static_cast<size_t>(B * F)), up(gate.size()), m(gate.size());
    ref::linear(linear("w_gate"), post, gate, threads_);
    ref::linear(linear("w_up"), post, up, threads_);
    ref::swiglu(gate, up, m);
    ref::linear_residual(linear("w_down"), m, h1, h2, threads_);
    ref::rmsnorm(h2, norm("final_norm"), h.rms_eps, n);

    std::vector<float> logits, scores;
    std::vector<bf16_bits> lowrank;
    if (dense) {
      logits.resize(static_cast<size_t>(B * Vd));
      ref::linear_f32(linear("lm_head"), n, logits, threads_);
    } else {
      lowrank.resize(static_cast<size_t>(B * h.lowrank));
      ref::linear(linear("lr_a"), n, lowrank, threads_);
      scores.resize(static_cast<size_t>(B * Vd));
      ref::linear_f32(linear("lr_b"), lowrank, scores, threads_);
    }

    for (int64_t b = 0; b < B; ++b) {
      int32_t draft_id = 0, target = 0;
      float confidence = 0.0f;
      std::vector<int32_t> candidates;
      std::vector<float> exact;
      if (dense) {
        const int rank = step == 1 && !first_ranks.empty() ? first_ranks[static_cast<size_t>(b)] : 0;
        const auto top = ref::ranked(row(std::span<const float>(logits), b, Vd), rank);
        draft_id = static_cast<int32_t>(top.id);
        target = draft_id + d2t[static_cast<size_t>(draft_id)];
        confidence = top.confidence;
      } else {
        candidates = ref::topk(row(std::span<const float>(scores), b, Vd), cand_k_);
        std::vector<int32_t> targets;
        const auto nf = ref::widen(row(std::span<const bf16_bits>(n), b, H));
        const auto& head = linear("target_head");
        for (int32_t c : candidates) {
          targets.push_back(c + d2t[static_cast<size_t>(c)]);
          exact.push_back(head.acc(targets.back(), nf.data()));
        }
        const auto pick = ref::rescore(exact, targets);
        draft_id = candidates[static_cast<size_t>(pick.index)];
        target = pick.target_id;
        confidence = pick.confidence;
      }
      const size_t at = static_cast<size_t>(b * steps + (step - 1));
      out.tokens[at] = target;
      out.confidences[at] = confidence;
      std::copy_n(h2.begin() + b * H, H, out.hidden.begin() + static_cast<ptrdiff_t>(at * H));

      if (tr) {
        auto slice = [b](const std::vector<bf16_bits>& all, int64_t width) {
          return std::vector<bf16_bits>(all.begin() + b * width, all.begin() + (b + 1) * width);
        };
        StepTrace& t = tr[b];
        t.position = positions[static_cast<size_t>(b)];
        t.key_begin = key_begin[static_cast<size_t>(b)];
        t.g = slice(g, H);
        t.x = slice(x, 2 * H);
        t.q = slice(q_raw, q_width);
        t.k = slice(k_raw, kv_width);
        t.v = slice(v, kv_width);
        if (h.qk_norm) {
          t.q_normed = slice(q_normed, q_width);
          t.k_normed = slice(k_normed, kv_width);
        }
        t.q_rot = slice(q, q_width);
        t.k_rot = slice(k, kv_width);
        t.o = slice(o, q_width);
        t.h1 = slice(h1, H);
        t.post = slice(post, H);
        t.gate = slice(gate, F);
        t.up = slice(up, F);
        t.m = slice(m, F);
        t.h2 = slice(h2, H);
        t.n = slice(n, H);
        if (dense) {
          t.logits.assign(logits.begin() + b * Vd, logits.begin() + (b + 1) * Vd);
        } else {
          t.lowrank = slice(lowrank, h.lowrank);
          t.scores.assign(scores.begin() + b * Vd, scores.begin() + (b + 1) * Vd);
          t.candidates = std::move(candidates);
          t.exact = std::move(exact);
        }
        t.draft_id = draft_id;
        t.token = target;
        t.confidence = confidence;
      }
      tokens[static_cast<size_t>(b)] = target;
    }
    g = std::move(h2);
  }
  return out;
}

void Reference::reset(int slot) {
  slots_.reset(slot);
  state_[static_cast<size_t>(slot)].g.clear();
}

std::span<const bf16_bits> Reference::ring_k(int slot) const {
  slots_.empty(slot);  // throws naming an unknown slot
  return state_[static_cast<size_t>(slot)].k;
}

std::span<const bf16_bits> Reference::ring_v(int slot) const {
  slots_.empty(slot);
  return state_[static_cast<size_t>(slot)].v;
}

std::span<const bf16_bits> Reference::last_g(int slot) const {
  slots_.last_pos(slot);  // throws naming the slot when unknown or empty
  return state_[static_cast<size_t>(slot)].g;
}

}  // namespace tfe
