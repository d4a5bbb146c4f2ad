// Attention for one query at a time over exactly the cache slots it sees, in their order: the
// same bits for a query whatever else its call holds (other rows, other tree nodes, how many
// queries share its key count). A batched matrix product cannot promise that: PyTorch's CPU
// bmm hands batches to MKL, whose result for one batch entry changes with the batch's size
// (measured on torch 2.13 with SmolLM2's shapes: 60 of 60 random cases).
//
// Each (query, head) is computed in one fixed sequence: the scores as dot products over the
// head dimension, their maximum, exp(score - max) by a fixed polynomial, their sum over the
// slots in order, and the values weighted by them, also in order. One thread takes the heads of
// a KV group (or a part of them) for every query of a cache row: the keys those queries share
// (the committed prefix) are read in blocks that each (query, head) pair uses while they sit in
// the first-level cache, so a draft's tokens and a group's heads load each key once between
// them. The blocks change what is read when, not the sequence of any pair's arithmetic: a
// query's bits are those it gets alone (tests/test_quant.py), and those of the kernel that took
// one (query, head) at a time, in 0.59-0.89x its time (benchmarks/results/attention_teams.md).

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
constexpr int kScoreKeys = 8;  // keys whose scores are computed side by side

inline int64_t token_of(const Attention& P, int64_t g) {
  return P.tokens == nullptr ? g : P.tokens[g];
}

// The three phases of one (query, head): the scores of keys [j0, j1) of its slots, the softmax
// of its n scores in place (returning 1 / their sum), and the values of keys [j0, j1) added
// into its accumulator (acc, its head dimension rounded up to whole vectors). A key's score and
// a lane's sum over the values come out the same whichever blocks [j0, j1) cut the keys into:
// each key's products run in one sequence, and a lane's sum adds the keys in slot order. C: the
// head dimension in vectors where it is known when compiled (dimensions 64 and 128: the arrays
// below stay in registers), 0 where not.
struct Pair {
  const float* query;
  const float* keys;    // its cache row and KV head
  const float* values;
  const int64_t* slots;
  float* out;
};

// The largest of n scores, in order (both paths' softmax subtracts it).
inline float largest(const float* s, int64_t n) {
  float top = -INFINITY;
  for (int64_t i = 0; i < n; ++i) top = s[i] > top ? s[i] : top;
  return top;
}

template <int C>
struct Avx512 {
  static constexpr int64_t kLanes = 16;

  __attribute__((target("avx512f"), always_inline)) static inline __mmask16 mask(
      int64_t c, int64_t chunks, int64_t dim) {
    if (C != 0 && dim == C * 16) return 0xFFFF;
    return c + 1 == chunks ? static_cast<__mmask16>((1u << (dim - 16 * (chunks - 1))) - 1u)
                           : static_cast<__mmask16>(0xFFFF);
  }

  __attribute__((target("avx512f"))) static void scores(const Attention& P, const Pair& p,
                                                        int64_t j0, int64_t j1, float* s) {
    const int64_t dim = P.dim, chunks = C ? C : (dim + 15) / 16;
    __m512 qv[C ? C : kMaxDim / 16];
    for (int64_t c = 0; c < chunks; ++c)
      qv[c] = _mm512_maskz_loadu_ps(mask(c, chunks, dim), p.query + 16 * c);
    int64_t j = j0;  // keys kScoreKeys at a time, their chains side by side
    for (; j + kScoreKeys <= j1; j += kScoreKeys) {
      __m512 acc[kScoreKeys];
      const float* key[kScoreKeys];
      for (int i = 0; i < kScoreKeys; ++i) {
        acc[i] = _mm512_setzero_ps();
        key[i] = p.keys + p.slots[j + i] * P.key_slot_stride;
      }
      for (int64_t c = 0; c < chunks; ++c) {
        for (int i = 0; i < kScoreKeys; ++i) {
          acc[i] = _mm512_fmadd_ps(
              qv[c], _mm512_maskz_loadu_ps(mask(c, chunks, dim), key[i] + 16 * c), acc[i]);
        }
      }
      for (int i = 0; i < kScoreKeys; ++i) s[j + i] = _mm512_reduce_add_ps(acc[i]) * P.scale;
    }
    for (; j < j1; ++j) {
      const float* key = p.keys + p.slots[j] * P.key_slot_stride;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c)
        acc = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(mask(c, chunks, dim), key + 16 * c),
                              acc);
      s[j] = _mm512_reduce_add_ps(acc) * P.scale;
    }
  }

  __attribute__((target("avx512f"))) static float softmax(float* s, int64_t n) {
    __m512 total = _mm512_setzero_ps();
    const __m512 shift = _mm512_set1_ps(largest(s, n));
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1u);
      const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), shift));
      _mm512_mask_storeu_ps(s + j, m, e);
      total = _mm512_add_ps(total, _mm512_maskz_mov_ps(m, e));
    }
    return 1.0f / _mm512_reduce_add_ps(total);
  }

  __attribute__((target("avx512f"))) static void values(const Attention& P, const Pair& p,
                                                        int64_t j0, int64_t j1, const float* s,
                                                        float* sum) {
    const int64_t dim = P.dim, chunks = C ? C : (dim + 15) / 16;
    __m512 acc[C ? C : kMaxDim / 16];
    for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_loadu_ps(sum + 16 * c);
    for (int64_t j = j0; j < j1; ++j) {
      const float* value = p.values + p.slots[j] * P.value_slot_stride;
      const __m512 w = _mm512_set1_ps(s[j]);
      for (int64_t c = 0; c < chunks; ++c)
        acc[c] = _mm512_fmadd_ps(
            w, _mm512_maskz_loadu_ps(mask(c, chunks, dim), value + 16 * c), acc[c]);
    }
    for (int64_t c = 0; c < chunks; ++c) _mm512_storeu_ps(sum + 16 * c, acc[c]);
  }

  __attribute__((target("avx512f"))) static void finish(const Attention& P, const Pair& p,
                                                        const float* sum, float inverse) {
    const int64_t dim = P.dim, chunks = C ? C : (dim + 15) / 16;
    for (int64_t c = 0; c < chunks; ++c)
      _mm512_mask_storeu_ps(p.out + 16 * c, mask(c, chunks, dim),
                            _mm512_mul_ps(_mm512_loadu_ps(sum + 16 * c), _mm512_set1_ps(inverse)));
  }
};

// Lanes [0, width - 8c) of chunk c, at most 8: a mask for AVX2's masked loads and stores.
__attribute__((target("avx2"))) inline __m256i lanes(int64_t c, int64_t width) {
  const int64_t left = width - 8 * c;
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left < 8 ? left : 8)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The same with AVX2, 8 lanes at a time. C as above (8: dimension 64, 16: 128), or 0 with
// ``Whole`` saying whether the dimension is whole vectors (else masked loads at its end).
template <int C, bool Whole = true>
struct Avx2 {
  static constexpr int64_t kLanes = 8;
  // A value pass keeps at most this many vectors of its sum in registers at once.
  static constexpr int64_t kWindow = 8;

  __attribute__((target("avx2"), always_inline)) static inline __m256 load8(const float* at,
                                                                            int64_t c,
                                                                            int64_t dim) {
    if constexpr (Whole) return _mm256_loadu_ps(at + 8 * c);
    return _mm256_maskload_ps(at + 8 * c, lanes(c, dim));
  }

  __attribute__((target("avx2,fma"))) static void scores(const Attention& P, const Pair& p,
                                                         int64_t j0, int64_t j1, float* s) {
    const int64_t dim = P.dim, chunks = C ? C : (dim + 7) / 8;
    __m256 qv[C ? C : kMaxDim / 8];
    for (int64_t c = 0; c < chunks; ++c) qv[c] = load8(p.query, c, dim);
    int64_t j = j0;
    for (; j + kScoreKeys <= j1; j += kScoreKeys) {
      __m256 acc[kScoreKeys];
      const float* key[kScoreKeys];
      for (int i = 0; i < kScoreKeys; ++i) {
        acc[i] = _mm256_setzero_ps();
        key[i] = p.keys + p.slots[j + i] * P.key_slot_stride;
      }
      for (int64_t c = 0; c < chunks; ++c) {
        for (int i = 0; i < kScoreKeys; ++i) {
          acc[i] = _mm256_fmadd_ps(qv[c], load8(key[i], c, dim), acc[i]);
        }
      }
      for (int i = 0; i < kScoreKeys; ++i) s[j + i] = sum256(acc[i]) * P.scale;
    }
    for (; j < j1; ++j) {
      const float* key = p.keys + p.slots[j] * P.key_slot_stride;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c) acc = _mm256_fmadd_ps(qv[c], load8(key, c, dim), acc);
      s[j] = sum256(acc) * P.scale;
    }
  }

  __attribute__((target("avx2,fma"))) static float softmax(float* s, int64_t n) {
    __m256 total = _mm256_setzero_ps();
    const __m256 shift = _mm256_set1_ps(largest(s, n));
    for (int64_t j = 0; j < n; j += 8) {
      const __m256i m = lanes(0, n - j);
      const __m256 e = exp256(_mm256_sub_ps(_mm256_maskload_ps(s + j, m), shift));
      _mm256_maskstore_ps(s + j, m, e);
      total = _mm256_add_ps(total, _mm256_and_ps(e, _mm256_castsi256_ps(m)));
    }
    return 1.0f / sum256(total);
  }

  __attribute__((target("avx2,fma"))) static void values(const Attention& P, const Pair& p,
                                                         int64_t j0, int64_t j1, const float* s,
                                                         float* sum) {
    const int64_t dim = P.dim, chunks = C ? C : (dim + 7) / 8;
    for (int64_t first = 0; first < chunks; first += kWindow) {  // a lane's keys stay in order
      const int64_t width = std::min(kWindow, chunks - first);
      __m256 acc[kWindow];
      for (int64_t c = 0; c < width; ++c) acc[c] = _mm256_loadu_ps(sum + 8 * (first + c));
      for (int64_t j = j0; j < j1; ++j) {
        const float* value = p.values + p.slots[j] * P.value_slot_stride;
        const __m256 w = _mm256_set1_ps(s[j]);
        for (int64_t c = 0; c < width; ++c)
          acc[c] = _mm256_fmadd_ps(w, load8(value, first + c, dim), acc[c]);
      }
      for (int64_t c = 0; c < width; ++c) _mm256_storeu_ps(sum + 8 * (first + c), acc[c]);
    }
  }

  __attribute__((target("avx2,fma"))) static void finish(const Attention& P, const Pair& p,
                                                         const float* sum, float inverse) {
    const int64_t dim = P.dim, chunks = C ? C : (dim + 7) / 8;
    for (int64_t c = 0; c < chunks; ++c)
      _mm256_maskstore_ps(p.out + 8 * c, lanes(c, dim),
                          _mm256_mul_ps(_mm256_loadu_ps(sum + 8 * c), _mm256_set1_ps(inverse)));
  }
};

// A team: queries of one cache row (a decode step's one token, or a draft's tokens), at most
// kTeam of them, which share the first `shared` entries of their slot lists (the committed
// prefix; a tree's nodes then see their own ancestors). The cap bounds a work item's scores
// (every pair's are kept until the shared values are read) and splits a prefill chunk's
// queries into items for the threads.
constexpr int64_t kTeam = 16;

struct Team {
  std::vector<int64_t> queries;
  int64_t shared = 0;
};

std::vector<Team> teams_of(const Attention& P) {
  std::vector<Team> teams;
  std::vector<int64_t> team_of_row;  // by cache row, its open team + 1 (0: none)
  for (int64_t g = 0; g < P.queries; ++g) {
    const int64_t row = P.rows[g];
    if (row >= static_cast<int64_t>(team_of_row.size())) team_of_row.resize(row + 1, 0);
    if (team_of_row[row] == 0 ||
        static_cast<int64_t>(teams[team_of_row[row] - 1].queries.size()) == kTeam) {
      teams.push_back({{g}, P.counts[g]});
      team_of_row[row] = static_cast<int64_t>(teams.size());
      continue;
    }
    Team& team = teams[team_of_row[row] - 1];
    const int64_t* first = P.slots + team.queries[0] * P.width;
    const int64_t* mine = P.slots + g * P.width;
    int64_t same = 0;
    const int64_t most = std::min(team.shared, P.counts[g]);
    while (same < most && first[same] == mine[same]) ++same;
    team.shared = same;
    team.queries.push_back(g);
  }
  return teams;
}

// Keys a team's (query, head) pairs read in turn while they stay in the first-level cache.
constexpr int64_t kBlock = 32;

// One work item: the heads [h0, h1) of KV head kv for every query of a team. The scores, then
// the values, of the shared keys in blocks of kBlock, every pair reading a block before the
// next is loaded (the heads of a KV group and the tokens of a draft read each key once from
// memory between them, not once each); then each pair's own keys and its softmax.
template <typename K>
void attend_team(const Attention& P, const Team& team, int64_t h0, int64_t h1,
                 std::vector<float>& scratch) {
  const int64_t group = P.heads / P.kv_heads, heads = h1 - h0;
  const int64_t pairs = static_cast<int64_t>(team.queries.size()) * heads;
  const int64_t stride = P.width + 16, padded = (P.dim + K::kLanes - 1) / K::kLanes * K::kLanes;
  scratch.resize(pairs * (stride + padded));
  float* scores = scratch.data();
  float* sums = scores + pairs * stride;
  std::fill(sums, sums + pairs * padded, 0.0f);
  std::vector<Pair> pair(pairs);
  for (int64_t m = 0; m < static_cast<int64_t>(team.queries.size()); ++m) {
    const int64_t g = team.queries[m];
    for (int64_t h = h0; h < h1; ++h) {
      pair[m * heads + h - h0] = {
          P.q + token_of(P, g) * P.q_stride + h * P.dim,
          P.keys + P.rows[g] * P.key_row_stride + (h / group) * P.dim,
          P.values + P.rows[g] * P.value_row_stride + (h / group) * P.dim,
          P.slots + g * P.width, P.out + token_of(P, g) * P.out_stride + h * P.dim};
    }
  }
  for (int64_t j0 = 0; j0 < team.shared; j0 += kBlock) {
    const int64_t j1 = std::min(j0 + kBlock, team.shared);
    for (int64_t i = 0; i < pairs; ++i) K::scores(P, pair[i], j0, j1, scores + i * stride);
  }
  std::vector<float> inverse(pairs);
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t n = P.counts[team.queries[i / heads]];
    K::scores(P, pair[i], team.shared, n, scores + i * stride);
    inverse[i] = K::softmax(scores + i * stride, n);
  }
  for (int64_t j0 = 0; j0 < team.shared; j0 += kBlock) {
    const int64_t j1 = std::min(j0 + kBlock, team.shared);
    for (int64_t i = 0; i < pairs; ++i)
      K::values(P, pair[i], j0, j1, scores + i * stride, sums + i * padded);
  }
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t n = P.counts[team.queries[i / heads]];
    K::values(P, pair[i], team.shared, n, scores + i * stride, sums + i * padded);
    K::finish(P, pair[i], sums + i * padded, inverse[i]);
  }
}

template <typename K>
void attend_all(const Attention& P) {
  const std::vector<Team> teams = teams_of(P);
  const int64_t group = P.heads / P.kv_heads;
  int64_t total = 0;
  for (int64_t g = 0; g < P.queries; ++g) total += P.counts[g];
  // A KV group's heads in `parts` items: one item each (the key loads shared) unless that
  // leaves a thread idle, then fewer heads an item down to one (as many items as pairs).
  const int64_t threads = at::get_num_threads();
  const int64_t units = static_cast<int64_t>(teams.size()) * P.kv_heads;
  int64_t parts = 1;
  while (parts < group && units * parts < 2 * threads) ++parts;
  const int64_t items = units * parts;
  const int64_t work = total * P.heads * P.dim / 16 + 1;
  const int64_t grain = std::max<int64_t>(1, items * 2048 / work);
  at::parallel_for(0, items, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t part = item % parts, unit = item / parts;
      const int64_t kv = unit % P.kv_heads;
      const int64_t h0 = kv * group + group * part / parts;
      const int64_t h1 = kv * group + group * (part + 1) / parts;
      attend_team<K>(P, teams[unit / P.kv_heads], h0, h1, scratch);
    }
  });
}

}  // namespace

namespace quickdraft_kernels {

void attend_queries(const Attention& P, int64_t path) {
  if (path == 1) {
    if (P.dim == 64) return attend_all<Avx512<4>>(P);
    if (P.dim == 128) return attend_all<Avx512<8>>(P);
    return attend_all<Avx512<0>>(P);
  }
  if (P.dim == 64) return attend_all<Avx2<8>>(P);
  if (P.dim == 128) return attend_all<Avx2<16>>(P);
  if (P.dim % 8 == 0) return attend_all<Avx2<0, true>>(P);
  return attend_all<Avx2<0, false>>(P);
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
  const int64_t* row = rows.data_ptr<int64_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t g = 0; g < queries; ++g) {
    TORCH_CHECK(count[g] > 0 && count[g] <= slots.size(1), "attend: counts out of range");
    TORCH_CHECK(row[g] >= 0 && row[g] < keys.size(0), "attend: a row is out of range");
    for (int64_t j = 0; j < count[g]; ++j) {
      TORCH_CHECK(slot[g * slots.size(1) + j] >= 0 && slot[g * slots.size(1) + j] < keys.size(1),
                  "attend: a slot is out of range");
    }
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
