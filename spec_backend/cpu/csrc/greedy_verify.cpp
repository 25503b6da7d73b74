// A batch of greedy requests verified in one call (spec_backend/cpu/sampler_ops.py): what the rejection
// sampler's composed ops give for it — each request's drafts accepted while each equals the argmax of its
// target row (a draft outside [0, V) ends them), then the argmax of the row after the last accepted draft
// (its bonus row after all of them), then PLACEHOLDER_TOKEN_ID (-1). The argmax is torch's: the first
// maximum of a row, the first NaN of a row holding one.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

namespace {

template <typename T>
int64_t argmax_row(const T* row, int64_t v) {
  int64_t best = 0;
  T top = row[0];
  for (int64_t j = 1; j < v && !std::isnan(top); ++j)
    if (std::isnan(row[j]) || row[j] > top) top = row[j], best = j;
  return best;
}

template <typename T>
void verify(const at::Tensor& logits, const int64_t* drafts, const int64_t* target, const int64_t* bonus,
            const int64_t* cu, int64_t batch, int64_t* out, int64_t width) {
  const T* rows = logits.data_ptr<T>();
  const int64_t v = logits.size(1);
  const auto argmax = [&](int64_t r) { return argmax_row(rows + r * v, v); };
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t first = b == 0 ? 0 : cu[b - 1], count = cu[b] - first;
    int64_t* row = out + b * width;
    int64_t n = 0, final = -1;
    for (; n < count; ++n) {
      const int64_t draft = drafts[first + n], best = argmax(target[first + n]);
      if (draft < 0 || draft >= v || draft != best) {
        final = best;
        break;
      }
      row[n] = draft;
    }
    row[n] = n == count ? argmax(bonus[b]) : final;
  }
}

at::Tensor greedy_chain_output(const at::Tensor& logits, const at::Tensor& draft_ids, const at::Tensor& target_rows,
                               const at::Tensor& bonus_rows, const at::Tensor& cu_num_draft_tokens,
                               int64_t max_spec_len) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0 &&
                  (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kDouble),
              "logits must be float32 or float64 [N, V > 0], got ", logits.scalar_type(), " ", logits.sizes());
  const int64_t batch = bonus_rows.numel(), total = draft_ids.numel();
  TORCH_CHECK(cu_num_draft_tokens.numel() == batch && target_rows.numel() == total && max_spec_len >= 0,
              "need one cu_num_draft_tokens entry per request and one target row per draft, got ",
              cu_num_draft_tokens.numel(), " for ", batch, " requests and ", target_rows.numel(), " for ", total);
  const auto longs = [](const at::Tensor& t) { return t.to(at::kLong).contiguous(); };
  const auto drafts = longs(draft_ids), target = longs(target_rows), bonus = longs(bonus_rows);
  const auto cu = longs(cu_num_draft_tokens);
  const int64_t *cp = cu.data_ptr<int64_t>(), *tp = target.data_ptr<int64_t>(), *bp = bonus.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t first = b == 0 ? 0 : cp[b - 1];
    TORCH_CHECK(first <= cp[b] && cp[b] <= total && cp[b] - first <= max_spec_len && 0 <= bp[b] &&
                    bp[b] < logits.size(0),
                "request ", b, ": drafts ", first, "..", cp[b], " of ", total, " (at most ", max_spec_len,
                "), bonus row ", bp[b], " of ", logits.size(0));
  }
  for (int64_t t = 0; t < total; ++t)
    TORCH_CHECK(0 <= tp[t] && tp[t] < logits.size(0), "target row ", tp[t], " of draft ", t, " is not a row of ",
                logits.size(0));
  const int64_t width = max_spec_len + 1;
  auto out = at::full({batch, width}, -1, at::TensorOptions().dtype(at::kLong));
  const auto rows = logits.contiguous();
  if (rows.scalar_type() == at::kFloat)
    verify<float>(rows, drafts.data_ptr<int64_t>(), tp, bp, cp, batch, out.data_ptr<int64_t>(), width);
  else
    verify<double>(rows, drafts.data_ptr<int64_t>(), tp, bp, cp, batch, out.data_ptr<int64_t>(), width);
  return out.to(at::kInt);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(SPEC_OPS, m) {
  m.def("greedy_chain_output(Tensor logits, Tensor draft_ids, Tensor target_rows, Tensor bonus_rows, "
        "Tensor cu_num_draft_tokens, int max_spec_len) -> Tensor",
        &greedy_chain_output);
}
