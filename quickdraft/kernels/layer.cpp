// The decoder layers of a quantized Llama-family model in one call: for each layer, RMS norm,
// the q/k/v product, rotary embedding of queries and keys, the cache write, attention, the
// output product and residual, RMS norm, the gate/up product, SiLU(gate) * up, the down
// product and residual. A Python layer costs about 40 small PyTorch operations; with the
// products at the memory rate those were a quarter of the 1.5B's decode step and most of
// SmolLM2-135M's (benchmarks/results/step_profile.md).
//
// Batch-invariant like the kernels it calls: every operation outside the products and
// attention works on one token's row by itself, in a fixed order (the norm's sum of squares in
// 16 lanes, then their fixed sum), the products and attention are those of superblock.cpp,
// groups.cpp and attention.cpp, and each runs on every code path with the same float
// operations (AVX2 for the element-wise parts, which every compiled path has). So a token's
// hidden state is the same bits whatever else the call holds. It is not bit for bit the
// Python layer's: PyTorch sums a norm's squares and computes SiLU's exponential in its own
// orders.
//
// Per layer, in order: weights holds the attention norm, the MLP norm, then the packed parts of
// the q/k/v, o, gate/up and down products; biases holds each part's bias (or None); spec holds
// per product its part count, then per part its layout (0 superblock, 1 groups), out
// features, in features, code bits, sub-block (32, or 16 for superblocks in a GGUF's Q6_K
// form) and whether a superblock record holds its factors in float16. A product's parts are
// runs of its output rows, each in its own form (a quantized file's q/k in 4 bits beside its
// value projection in Q6_K): their outputs side by side.
//
// attn_input (optional, one layer): what the q/k/v product reads in place of the normed state,
// which stays the residual: an EAGLE draft layer (drafters/eagle/compiled.py).

#include <ATen/Parallel.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <immintrin.h>

#include "entry.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

namespace {

using quickdraft_kernels::Attention;
using quickdraft_simd::sum256;

constexpr int64_t kNorms = 2, kProducts = 4, kSpecPerPart = 6;

struct Part {
  const uint8_t* packed;
  const float* bias;
  int64_t layout, n, k, bits, sub;
  bool half;
};

struct Product {
  std::vector<Part> parts;
  int64_t n = 0, k = 0;
};

void run(const Part& p, const float* x, int64_t rows, int64_t path, float* y) {
  if (p.layout == 0) {
    quickdraft_kernels::superblock_product(x, rows, p.packed, p.n, p.k, p.bias, path, p.bits,
                                           p.sub, p.half, y);
  } else {
    quickdraft_kernels::group_product(x, rows, p.packed, p.n, p.k, p.bias, path, p.bits, y);
  }
}

// y [rows, p.n]: each part's rows computed into `scratch` [rows, part n], then copied into its
// columns (one part writes y itself).
void run(const Product& p, const float* x, int64_t rows, int64_t path, float* y,
         float* scratch) {
  if (p.parts.size() == 1) return run(p.parts[0], x, rows, path, y);
  int64_t column = 0;
  for (const Part& part : p.parts) {
    run(part, x, rows, path, scratch);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(y + r * p.n + column, scratch + r * part.n, part.n * sizeof(float));
    }
    column += part.n;
  }
}

// Rows [0, rows) of a per-token step, in threads once there are enough of them to pay.
template <typename F>
void each_row(int64_t rows, int64_t width, const F& f) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, width));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) f(r);
  });
}

// out = x / sqrt(mean(x^2) + eps) * w over d inputs (a multiple of 16): the squares summed in
// 16 lanes in order, the lanes then in a fixed tree.
__attribute__((target("avx2,fma"))) void rms_norm(const float* x, const float* w, int64_t d,
                                                  float eps, float* out) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    s0 = _mm256_add_ps(s0, _mm256_mul_ps(a, a));
    s1 = _mm256_add_ps(s1, _mm256_mul_ps(b, b));
  }
  const float r = 1.0f / std::sqrt(sum256(_mm256_add_ps(s0, s1)) / static_cast<float>(d) + eps);
  const __m256 rv = _mm256_set1_ps(r);
  for (int64_t i = 0; i < d; i += 8) {
    const __m256 y = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv),
                                   _mm256_loadu_ps(w + i));
    _mm256_storeu_ps(out + i, y);
  }
}

// out[j] = SiLU(gate[j]) * up[j] for n (a multiple of 8) entries: SiLU(g) = g * sigmoid(g),
// the sigmoid from e = exp(-|g|) <= 1 (1 / (1 + e) or e / (1 + e)), which never overflows.
__attribute__((target("avx2,fma"))) void silu_mul(const float* gate, const float* up, int64_t n,
                                                  float* out) {
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 g = _mm256_loadu_ps(gate + j);
    const __m256 e = quickdraft_simd::exp256(_mm256_or_ps(g, sign));  // exp(-|g|)
    const __m256 negative = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 sigmoid = _mm256_div_ps(_mm256_blendv_ps(one, e, negative), _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), _mm256_loadu_ps(up + j)));
  }
}

// Rotary embedding in place, Hugging Face's rotate-half convention, on `heads` heads of dim
// entries: v * cos + rotate_half(v) * sin, the two products then their sum (as PyTorch's).
void rotate(float* v, int64_t heads, int64_t dim, const float* cos, const float* sin) {
  const int64_t half = dim / 2;
  float copy[256];
  for (int64_t h = 0; h < heads; ++h, v += dim) {
    std::memcpy(copy, v, dim * sizeof(float));
    for (int64_t j = 0; j < half; ++j) v[j] = copy[j] * cos[j] + (-copy[j + half]) * sin[j];
    for (int64_t j = half; j < dim; ++j) v[j] = copy[j] * cos[j] + copy[j - half] * sin[j];
  }
}

const int64_t* longs(const at::Tensor& t, int64_t size, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.is_contiguous() && t.dim() >= 1 &&
                  t.size(0) == size,
              "decoder_layers: ", name, " must be contiguous int64 with ", size, " entries");
  return t.data_ptr<int64_t>();
}

std::vector<at::Tensor> decoder_layers(
    const at::Tensor& x, at::TensorList weights, const c10::List<std::optional<at::Tensor>>& biases,
    at::IntArrayRef spec, double eps, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& keys, const at::Tensor& values, const at::Tensor& write_rows,
    const at::Tensor& write_slots, const at::Tensor& query_tokens, const at::Tensor& query_rows,
    const at::Tensor& slots, const at::Tensor& counts, int64_t heads, int64_t kv_heads,
    at::IntArrayRef taps, int64_t path, const std::optional<at::Tensor>& attn_input) {
  TORCH_CHECK(path == quickdraft_simd::kAvx512Vnni || path == quickdraft_simd::kAvx2 ||
                  path == quickdraft_simd::kAvxVnni,
              "decoder_layers: path must be 1, 2 or 3");
  TORCH_CHECK(quickdraft_simd::supported(path), "decoder_layers: this CPU cannot run path ", path);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "decoder_layers: x must be contiguous float32 [tokens, hidden]");
  const int64_t tokens = x.size(0), hidden = x.size(1);
  TORCH_CHECK(keys.dim() == 5 && values.dim() == 5 && keys.sizes() == values.sizes(),
              "decoder_layers: keys and values must be [layers, B, S, Hkv, D]");
  const int64_t dim = keys.size(4);
  TORCH_CHECK(keys.size(3) == kv_heads && kv_heads > 0 && heads % kv_heads == 0 && dim % 2 == 0 &&
                  dim <= 256,
              "decoder_layers: cache heads or head dimension do not match");
  for (const at::Tensor* t : {&keys, &values}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->stride(4) == 1 && t->stride(3) == dim,
                "decoder_layers: keys and values must be float32 with [Hkv, D] contiguous");
  }
  TORCH_CHECK(hidden % 16 == 0, "decoder_layers: hidden size must be a multiple of 16");
  for (const at::Tensor* t : {&cos, &sin}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 &&
                    t->size(0) == tokens && t->size(1) == dim,
                "decoder_layers: cos and sin must be contiguous float32 [tokens, head_dim]");
  }
  const int64_t* write_row = longs(write_rows, tokens, "write_rows");
  const int64_t* write_slot = longs(write_slots, tokens, "write_slots");
  const int64_t* query_token = longs(query_tokens, tokens, "query_tokens");
  const int64_t* query_row = longs(query_rows, tokens, "query_rows");
  const int64_t* count = longs(counts, tokens, "counts");
  TORCH_CHECK(slots.dim() == 2, "decoder_layers: slots must be [tokens, width]");
  const int64_t* slot = longs(slots, tokens, "slots");
  const int64_t batch = keys.size(1), capacity = keys.size(2), width = slots.size(1);
  std::vector<char> seen(tokens, 0);
  for (int64_t i = 0; i < tokens; ++i) {
    TORCH_CHECK(write_row[i] >= 0 && write_row[i] < batch && write_slot[i] >= 0 &&
                    write_slot[i] < capacity && query_row[i] >= 0 && query_row[i] < batch &&
                    query_token[i] >= 0 && query_token[i] < tokens && count[i] > 0 &&
                    count[i] <= width && !seen[query_token[i]],
                "decoder_layers: a token's cache row, slot or query is out of range");
    seen[query_token[i]] = 1;
    for (int64_t j = 0; j < count[i]; ++j) {
      TORCH_CHECK(slot[i * width + j] >= 0 && slot[i * width + j] < capacity,
                  "decoder_layers: an attention slot is out of range");
    }
  }
  // A given attention input (one layer only): the q/k/v product reads it in place of the
  // normed state, which stays the residual (an EAGLE draft layer: EAGLE-1's has no input norm,
  // EAGLE-3's reads its normed embedding and feature side by side, twice the hidden width).
  const float* given = nullptr;
  int64_t given_width = hidden;
  if (attn_input.has_value()) {
    TORCH_CHECK(attn_input->dim() == 2 && attn_input->size(0) == tokens &&
                    attn_input->scalar_type() == at::kFloat && attn_input->is_contiguous(),
                "decoder_layers: attn_input must be contiguous float32 [tokens, width]");
    given = attn_input->data_ptr<float>();
    given_width = attn_input->size(1);
  }
  const int64_t q_width = heads * dim, kv_width = kv_heads * dim;
  const int64_t qkv_width = q_width + 2 * kv_width;
  // The spec read in order: per layer its norms, then per product its parts.
  std::vector<Product> products;
  std::vector<const float*> norms;
  size_t at_spec = 0, at_weight = 0, at_bias = 0;
  int64_t intermediate = 0, scratch_width = 0;
  while (at_spec < spec.size()) {
    const int64_t l = static_cast<int64_t>(norms.size()) / kNorms;
    for (int64_t n = 0; n < kNorms; ++n, ++at_weight) {
      TORCH_CHECK(at_weight < weights.size(), "decoder_layers: layer ", l, " has no norms");
      const at::Tensor& norm = weights[at_weight];
      TORCH_CHECK(norm.scalar_type() == at::kFloat && norm.is_contiguous() &&
                      norm.numel() == hidden,
                  "decoder_layers: layer ", l, "'s norms must be float32 [", hidden, "]");
      norms.push_back(norm.data_ptr<float>());
    }
    for (int64_t p = 0; p < kProducts; ++p) {
      TORCH_CHECK(at_spec < spec.size() && spec[at_spec] >= 1 &&
                      at_spec + 1 + spec[at_spec] * kSpecPerPart <= spec.size(),
                  "decoder_layers: layer ", l, "'s product ", p, " has no parts in the spec");
      Product product;
      const int64_t count = spec[at_spec++];
      for (int64_t j = 0; j < count; ++j, at_spec += kSpecPerPart, ++at_weight, ++at_bias) {
        const int64_t* s = spec.data() + at_spec;
        TORCH_CHECK(at_weight < weights.size() && at_bias < biases.size(),
                    "decoder_layers: weights, biases and spec do not describe the same layers");
        const at::Tensor& packed = weights[at_weight];
        const int64_t bytes = s[0] == 0 ? quickdraft_kernels::superblock_bytes(s[1], s[2], s[3],
                                                                               s[4], s[5] != 0)
                                        : quickdraft_kernels::group_bytes(s[1], s[2], s[3]);
        TORCH_CHECK((s[0] == 0 || s[0] == 1) && s[1] > 0 && s[2] % 32 == 0 &&
                        (s[3] == 4 || s[3] == 8 || (s[0] == 0 && s[3] == 6)) &&
                        (s[4] == 32 || (s[0] == 0 && s[3] == 6 && s[4] == 16)) &&
                        (s[5] == 0 || (s[0] == 0 && s[5] == 1)) &&
                        packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                        packed.numel() == bytes,
                    "decoder_layers: layer ", l, "'s product ", p, " does not match its spec");
        const std::optional<at::Tensor> bias = biases.get(at_bias);
        const float* b = nullptr;
        if (bias.has_value()) {
          TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                          bias->numel() == s[1],
                      "decoder_layers: layer ", l, "'s bias ", p, " must be float32 [", s[1],
                      "]");
          b = bias->data_ptr<float>();
        }
        TORCH_CHECK(j == 0 || s[2] == product.k,
                    "decoder_layers: layer ", l, "'s product ", p, " has parts of two widths");
        product.parts.push_back(
            {packed.data_ptr<uint8_t>(), b, s[0], s[1], s[2], s[3], s[4], s[5] != 0});
        product.n += s[1];
        product.k = s[2];
      }
      if (count > 1) scratch_width = std::max(scratch_width, product.n);
      products.push_back(std::move(product));
    }
    const Product* at = &products[l * kProducts];
    if (l == 0) intermediate = at[3].k;
    TORCH_CHECK(at[0].k == given_width && at[0].n == qkv_width && at[1].k == q_width &&
                    at[1].n == hidden && at[2].k == hidden && at[3].n == hidden &&
                    at[3].k == intermediate && at[2].n == 2 * intermediate,
                "decoder_layers: layer ", l, "'s product shapes do not fit the model");
  }
  const int64_t layers = static_cast<int64_t>(norms.size()) / kNorms;
  TORCH_CHECK(at_weight == weights.size() && at_bias == biases.size(),
              "decoder_layers: weights, biases and spec do not describe the same layers");
  TORCH_CHECK(keys.size(0) >= layers, "decoder_layers: the cache has fewer layers than the spec");
  TORCH_CHECK(given == nullptr || layers == 1, "decoder_layers: attn_input is for one layer");
  for (int64_t t : taps) {
    TORCH_CHECK(t >= 0 && t < layers, "decoder_layers: tap layer ", t, " out of range");
  }

  auto buffer = [](int64_t n) { return std::unique_ptr<float[]>(new float[n]); };
  const auto h = buffer(tokens * std::max(hidden, q_width));
  const auto qkv = buffer(tokens * qkv_width);
  const auto out = buffer(tokens * hidden);
  const auto gate_up = buffer(tokens * 2 * intermediate);
  const auto act = buffer(tokens * intermediate);
  const auto scratch = buffer(tokens * std::max<int64_t>(scratch_width, 1));
  float* state = x.data_ptr<float>();
  const float* cos_ = cos.data_ptr<float>();
  const float* sin_ = sin.data_ptr<float>();
  const float epsilon = static_cast<float>(eps);
  std::vector<at::Tensor> tapped;

  for (int64_t l = 0; l < layers; ++l) {
    const Product* p = &products[l * kProducts];
    const float* attn_norm = norms[l * kNorms];
    const float* mlp_norm = norms[l * kNorms + 1];
    float* layer_keys = keys.data_ptr<float>() + l * keys.stride(0);
    float* layer_values = values.data_ptr<float>() + l * values.stride(0);

    if (given == nullptr) {
      each_row(tokens, hidden, [&](int64_t i) {
        rms_norm(state + i * hidden, attn_norm, hidden, epsilon, h.get() + i * hidden);
      });
    }
    run(p[0], given != nullptr ? given : h.get(), tokens, path, qkv.get(), scratch.get());
    each_row(tokens, qkv_width, [&](int64_t i) {
      float* row = qkv.get() + i * qkv_width;
      rotate(row, heads + kv_heads, dim, cos_ + i * dim, sin_ + i * dim);
      std::memcpy(layer_keys + write_row[i] * keys.stride(1) + write_slot[i] * keys.stride(2),
                  row + q_width, kv_width * sizeof(float));
      std::memcpy(layer_values + write_row[i] * values.stride(1) + write_slot[i] * values.stride(2),
                  row + q_width + kv_width, kv_width * sizeof(float));
    });
    const Attention problem{qkv.get(), layer_keys, layer_values, query_token, query_row, slot,
                            count, h.get(), tokens, heads, kv_heads, dim, width, qkv_width,
                            q_width, keys.stride(1), keys.stride(2), values.stride(1),
                            values.stride(2), 1.0f / std::sqrt(static_cast<float>(dim))};
    quickdraft_kernels::attend_queries(problem, path);
    run(p[1], h.get(), tokens, path, out.get(), scratch.get());
    each_row(tokens, hidden, [&](int64_t i) {
      float* row = state + i * hidden;
      const float* add = out.get() + i * hidden;
      for (int64_t j = 0; j < hidden; ++j) row[j] = row[j] + add[j];
      rms_norm(row, mlp_norm, hidden, epsilon, h.get() + i * hidden);
    });
    run(p[2], h.get(), tokens, path, gate_up.get(), scratch.get());
    each_row(tokens, 2 * intermediate, [&](int64_t i) {
      const float* row = gate_up.get() + i * 2 * intermediate;
      silu_mul(row, row + intermediate, intermediate, act.get() + i * intermediate);
    });
    run(p[3], act.get(), tokens, path, out.get(), scratch.get());
    each_row(tokens, hidden, [&](int64_t i) {
      float* row = state + i * hidden;
      const float* add = out.get() + i * hidden;
      for (int64_t j = 0; j < hidden; ++j) row[j] = row[j] + add[j];
    });
    if (std::find(taps.begin(), taps.end(), l) != taps.end()) tapped.push_back(x.clone());
  }
  return tapped;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(quickdraft_kernels, m) {
  m.def("decoder_layers(Tensor(a!) x, Tensor[] weights, Tensor?[] biases, int[] spec, "
        "float eps, Tensor cos, Tensor sin, Tensor(b!) keys, Tensor(c!) values, "
        "Tensor write_rows, Tensor write_slots, Tensor query_tokens, Tensor query_rows, "
        "Tensor slots, Tensor counts, int heads, int kv_heads, int[] taps, int path, "
        "Tensor? attn_input=None) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(quickdraft_kernels, CPU, m) { m.impl("decoder_layers", &decoder_layers); }
