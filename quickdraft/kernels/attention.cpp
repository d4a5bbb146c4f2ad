// Attention for one query at a time over exactly the cache slots it sees, in their order: the
// same bits for a query whatever else its call holds (other rows, other tree nodes, how many
// queries share its key count). A batched matrix product cannot promise that: PyTorch's CPU
// bmm hands batches to MKL, whose result for one batch entry changes with the batch's size
// (measured on torch 2.13 with SmolLM2's shapes: 60 of 60 random cases).
//
// Each (query, head) is computed by one thread, in one fixed sequence: the scores as dot
// products over the head dimension, their maximum, exp(score - max) by a fixed polynomial,
// their sum over the slots in order, and the values weighted by them, also in order.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <immintrin.h>

#include "entry.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using quickdraft_kernels::Attention;
using quickdraft_simd::exp256;
using quickdraft_simd::exp512;
using quickdraft_simd::sum256;

constexpr int64_t kMaxDim = 256;
constexpr int kScoreKeys = 4;  // keys whose scores are computed side by side

inline int64_t token_of(const Attention& P, int64_t g) {
  return P.tokens == nullptr ? g : P.tokens[g];
}

// One (query, head) with AVX-512: 16 lanes of the head dimension at a time, a masked tail.
__attribute__((target("avx512f"))) void one_avx512(const Attention& P, int64_t g, int64_t h,
                                                   std::vector<float>& scores) {
  const int64_t dim = P.dim, n = P.counts[g];
  const int64_t kv = h / (P.heads / P.kv_heads);
  const int64_t chunks = (dim + 15) / 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (dim - 16 * (chunks - 1))) - 1u);
  auto mask = [&](int64_t c) { return c + 1 == chunks ? tail : static_cast<__mmask16>(0xFFFF); };
  const float* query = P.q + token_of(P, g) * P.q_stride + h * dim;
  __m512 qv[kMaxDim / 16];
  for (int64_t c = 0; c < chunks; ++c) qv[c] = _mm512_maskz_loadu_ps(mask(c), query + 16 * c);
  const int64_t* slots = P.slots + g * P.width;
  const float* keys = P.keys + P.rows[g] * P.key_row_stride + kv * dim;
  const float* values = P.values + P.rows[g] * P.value_row_stride + kv * dim;
  // Keys kScoreKeys at a time: each key's products in the same sequence as alone (the same
  // bits), their chains side by side so that one key's fused adds do not wait on the last.
  int64_t j = 0;
  for (; j + kScoreKeys <= n; j += kScoreKeys) {
    __m512 acc[kScoreKeys];
    const float* key[kScoreKeys];
    for (int i = 0; i < kScoreKeys; ++i) {
      acc[i] = _mm512_setzero_ps();
      key[i] = keys + slots[j + i] * P.key_slot_stride;
    }
    for (int64_t c = 0; c < chunks; ++c) {
      for (int i = 0; i < kScoreKeys; ++i) {
        acc[i] = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(mask(c), key[i] + 16 * c), acc[i]);
      }
    }
    for (int i = 0; i < kScoreKeys; ++i) scores[j + i] = _mm512_reduce_add_ps(acc[i]) * P.scale;
  }
  for (; j < n; ++j) {
    const float* key = keys + slots[j] * P.key_slot_stride;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c)
      acc = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(mask(c), key + 16 * c), acc);
    scores[j] = _mm512_reduce_add_ps(acc) * P.scale;
  }
  float top = -INFINITY;
  for (int64_t i = 0; i < n; ++i) top = scores[i] > top ? scores[i] : top;
  __m512 total = _mm512_setzero_ps();
  const __m512 shift = _mm512_set1_ps(top);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1u);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores.data() + j), shift));
    _mm512_mask_storeu_ps(scores.data() + j, m, e);
    total = _mm512_add_ps(total, _mm512_maskz_mov_ps(m, e));
  }
  const float inverse = 1.0f / _mm512_reduce_add_ps(total);
  __m512 acc[kMaxDim / 16];
  for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const float* value = values + slots[j] * P.value_slot_stride;
    const __m512 w = _mm512_set1_ps(scores[j]);
    for (int64_t c = 0; c < chunks; ++c)
      acc[c] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(mask(c), value + 16 * c), acc[c]);
  }
  float* out = P.out + token_of(P, g) * P.out_stride + h * dim;
  for (int64_t c = 0; c < chunks; ++c)
    _mm512_mask_storeu_ps(out + 16 * c, mask(c), _mm512_mul_ps(acc[c], _mm512_set1_ps(inverse)));
}

// Lanes [0, width - 8c) of chunk c, at most 8: a mask for AVX2's masked loads and stores.
__attribute__((target("avx2"))) inline __m256i lanes(int64_t c, int64_t width) {
  const int64_t left = width - 8 * c;
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left < 8 ? left : 8)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 floats of chunk c: a plain load where the head dimension is whole vectors (``Whole``),
// else masked to the dimension (the same values either way).
template <bool Whole>
__attribute__((target("avx2"), always_inline)) inline __m256 load8(const float* at, int64_t c,
                                                                    int64_t dim) {
  if constexpr (Whole) return _mm256_loadu_ps(at + 8 * c);
  return _mm256_maskload_ps(at + 8 * c, lanes(c, dim));
}

// The same with AVX2: 8 lanes at a time, masked loads for the tail.
template <bool Whole>
__attribute__((target("avx2,fma"))) void one_avx2(const Attention& P, int64_t g, int64_t h,
                                                  std::vector<float>& scores) {
  const int64_t dim = P.dim, n = P.counts[g];
  const int64_t kv = h / (P.heads / P.kv_heads);
  const int64_t chunks = (dim + 7) / 8;
  const float* query = P.q + token_of(P, g) * P.q_stride + h * dim;
  __m256 qv[kMaxDim / 8];
  for (int64_t c = 0; c < chunks; ++c) qv[c] = load8<Whole>(query, c, dim);
  const int64_t* slots = P.slots + g * P.width;
  const float* keys = P.keys + P.rows[g] * P.key_row_stride + kv * dim;
  const float* values = P.values + P.rows[g] * P.value_row_stride + kv * dim;
  int64_t j = 0;  // keys kScoreKeys at a time, as one_avx512
  for (; j + kScoreKeys <= n; j += kScoreKeys) {
    __m256 acc[kScoreKeys];
    const float* key[kScoreKeys];
    for (int i = 0; i < kScoreKeys; ++i) {
      acc[i] = _mm256_setzero_ps();
      key[i] = keys + slots[j + i] * P.key_slot_stride;
    }
    for (int64_t c = 0; c < chunks; ++c) {
      for (int i = 0; i < kScoreKeys; ++i) {
        acc[i] = _mm256_fmadd_ps(qv[c], load8<Whole>(key[i], c, dim), acc[i]);
      }
    }
    for (int i = 0; i < kScoreKeys; ++i) scores[j + i] = sum256(acc[i]) * P.scale;
  }
  for (; j < n; ++j) {
    const float* key = keys + slots[j] * P.key_slot_stride;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      acc = _mm256_fmadd_ps(qv[c], load8<Whole>(key, c, dim), acc);
    }
    scores[j] = sum256(acc) * P.scale;
  }
  float top = -INFINITY;
  for (int64_t i = 0; i < n; ++i) top = scores[i] > top ? scores[i] : top;
  __m256 total = _mm256_setzero_ps();
  const __m256 shift = _mm256_set1_ps(top);
  for (int64_t j = 0; j < n; j += 8) {
    const __m256i m = lanes(0, n - j);
    const __m256 e = exp256(_mm256_sub_ps(_mm256_maskload_ps(scores.data() + j, m), shift));
    _mm256_maskstore_ps(scores.data() + j, m, e);
    total = _mm256_add_ps(total, _mm256_and_ps(e, _mm256_castsi256_ps(m)));
  }
  const float inverse = 1.0f / sum256(total);
  __m256 acc[kMaxDim / 8];
  for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const float* value = values + slots[j] * P.value_slot_stride;
    const __m256 w = _mm256_set1_ps(scores[j]);
    for (int64_t c = 0; c < chunks; ++c)
      acc[c] = _mm256_fmadd_ps(w, load8<Whole>(value, c, dim), acc[c]);
  }
  float* out = P.out + token_of(P, g) * P.out_stride + h * dim;
  for (int64_t c = 0; c < chunks; ++c)
    _mm256_maskstore_ps(out + 8 * c, lanes(c, dim), _mm256_mul_ps(acc[c], _mm256_set1_ps(inverse)));
}

}  // namespace

namespace quickdraft_kernels {

void attend_queries(const Attention& P, int64_t path) {
  int64_t total = 0;
  for (int64_t g = 0; g < P.queries; ++g) total += P.counts[g];
  const int64_t items = P.queries * P.heads;
  // One (query, head) per item; threads only when there is enough work to share.
  const int64_t work = total * P.heads * P.dim / 16 + 1;
  const int64_t grain = std::max<int64_t>(1, items * 2048 / work);
  at::parallel_for(0, items, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(P.width + 16);
    for (int64_t item = begin; item < end; ++item) {
      if (path == 1) {
        one_avx512(P, item / P.heads, item % P.heads, scores);
      } else if (P.dim % 8 == 0) {
        one_avx2<true>(P, item / P.heads, item % P.heads, scores);
      } else {
        one_avx2<false>(P, item / P.heads, item % P.heads, scores);
      }
    }
  });
}

}  // namespace quickdraft_kernels

namespace {

// path: 1 AVX-512, 2 AVX2 (as the 4-bit kernel's paths; the caller checks the CPU has it).
// Every query of a pass in one call: query g sees the first counts[g] slots of slots[g].
at::Tensor attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                  const at::Tensor& rows, const at::Tensor& slots, const at::Tensor& counts,
                  double scale, int64_t path) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && q.scalar_type() == at::kFloat,
              "attend: q must be contiguous float32 [G, H, D]");
  TORCH_CHECK(keys.dim() == 4 && values.dim() == 4, "attend: keys, values must be [B, S, Hkv, D]");
  const int64_t queries = q.size(0), dim = q.size(2), kv_heads = keys.size(2);
  for (const at::Tensor* t : {&keys, &values}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->stride(3) == 1 && t->stride(2) == dim &&
                    t->size(3) == dim && t->size(2) == kv_heads,
                "attend: keys and values must be float32 with [Hkv, D] contiguous");
  }
  TORCH_CHECK(dim <= kMaxDim, "attend: head dimension above ", kMaxDim);
  TORCH_CHECK(q.size(1) % kv_heads == 0, "attend: heads must be a multiple of kv heads");
  for (const at::Tensor* t : {&rows, &slots, &counts}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->size(0) == queries,
                "attend: rows [G], slots [G, n] and counts [G] must be contiguous int64");
  }
  TORCH_CHECK(slots.dim() == 2, "attend: slots must be [G, n]");
  const int64_t* count = counts.data_ptr<int64_t>();
  for (int64_t g = 0; g < queries; ++g) {
    TORCH_CHECK(count[g] > 0 && count[g] <= slots.size(1), "attend: counts out of range");
  }
  at::Tensor out = at::empty_like(q);
  const int64_t heads = q.size(1);
  const Attention P{q.data_ptr<float>(), keys.data_ptr<float>(), values.data_ptr<float>(),
                    nullptr, rows.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), count,
                    out.data_ptr<float>(), queries, heads, kv_heads, dim, slots.size(1),
                    heads * dim, heads * dim, keys.stride(0), keys.stride(1), values.stride(0),
                    values.stride(1), static_cast<float>(scale)};
  quickdraft_kernels::attend_queries(P, path);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(quickdraft_kernels, m) {
  m.def("attend(Tensor q, Tensor keys, Tensor values, Tensor rows, Tensor slots, "
        "Tensor counts, float scale, int path) -> Tensor");
}

TORCH_LIBRARY_IMPL(quickdraft_kernels, CPU, m) { m.impl("attend", &attend); }
