// A batch-invariant linear layer with 4-bit (or 8-bit) weights in superblocks, for x86 CPUs:
// y = x W^T + b.
//
// Weights: per output channel o, superblock s of 256 input channels (8 groups of 32; the last
// superblock of a row may hold fewer groups) and group j,
//
//     w = d[o,s] * sc[o,s,j] * q + dmin[o,s] * mn[o,s,j]
//
// with q in 0..15 (or 0..255), integer sub-scales sc in 0..255 and minimums mn in -127..127,
// and float32 d, dmin: the structure of a GGUF's Q4_K blocks (whose 6-bit scales and minimums
// it holds exactly). Activations: per row and superblock, x ~= a[r,s] * p with p in -127..127,
// and the int16 sums of p per group. Then, exactly in int32,
//
//     S = sum_j sc[j] * dot(q_j, p_j)      (at most 8 * 255 * 32 * 255 * 127 < 2^31)
//     M = sum_j mn[j] * sum(p_j)           (at most 8 * 127 * 32 * 127 < 2^31)
//
// and y[r,o] = sum_s ((d * float(S) + dmin * float(M)) * a[r,s]) + b[o], the float operations
// in that order, the same for every row whatever the row count, its place in the batch, the
// thread count or the instruction set (built with -ffp-contract=off). Against the 32-input
// groups of q4.cpp, a group costs two integer operations a row instead of six float ones, so
// a verify pass of 8-16 rows runs closer to the VNNI peak; activations share a scale over 256
// inputs instead of 32 (what llama.cpp's Q8_K does for its Q4_K products).
//
// Packed layout (uint8): per block of 16 outputs, its superblocks in order; a superblock's
// record is its groups' codes, then sc [8][16] uint8, mn [4 pairs][16 lanes][2] int8 (mn[2p + t]
// of a lane at 32p + 2 lane + t), d [16] and dmin [16] float32. Groups past a short
// superblock's end have sc = mn = 0. A group's codes, chunks of 64 bytes (what one VNNI
// instruction multiplies against 4 broadcast activation bytes, 16 outputs at once): 4 bits, 4
// chunks, chunk c holding inputs 8c..8c+7, byte 4 * lane + t: low nibble q[lane][8c + t], high
// nibble q[lane][8c + 4 + t]; 8 bits, 8 chunks, chunk c holding inputs 4c..4c+3, byte
// 4 * lane + t: q[lane][4c + t].

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kSuper = 8;  // groups a superblock
constexpr int64_t kLanes = 16;
constexpr int64_t kMetaBytes = kSuper * kLanes * 2 + 2 * kLanes * 4;

// A group's codes in a block of 16 outputs.
template <int Bits>
constexpr int64_t code_bytes() {
  return kLanes * kGroup * Bits / 8;
}

int64_t supers_of(int64_t groups) { return (groups + kSuper - 1) / kSuper; }

// Bytes of one block of 16 outputs over k inputs.
int64_t block_bytes(int64_t k, int64_t bits) {
  const int64_t groups = k / kGroup;
  return groups * kLanes * kGroup * bits / 8 + supers_of(groups) * kMetaBytes;
}

// Row activations, quantized per superblock: codes, the scale, the int16 sums per group.
struct Activations {
  std::vector<int8_t> codes;  // [rows, k]
  std::vector<float> scale;   // [rows, supers]
  std::vector<int16_t> sums;  // [rows, supers, 8], zero past a short superblock
  int64_t supers = 0;
};

// One superblock of n groups: codes nearbyint(x * (127 / amax)) (round half to even), as the
// PyTorch reference computes them.
__attribute__((target("avx2,fma,f16c"))) void quantize_super(const float* xs, int64_t n,
                                                             int8_t* codes, float* scale,
                                                             int16_t* sums) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 top = _mm256_setzero_ps();
  for (int64_t i = 0; i < n * kGroup; i += 8) {
    top = _mm256_max_ps(top, _mm256_andnot_ps(sign, _mm256_loadu_ps(xs + i)));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  const float amax = _mm_cvtss_f32(h);
  std::fill(sums, sums + kSuper, int16_t{0});
  if (!(amax > 0.0f)) {
    std::memset(codes, 0, n * kGroup);
    *scale = 0.0f;
    return;
  }
  *scale = amax / 127.0f;
  const __m256 inverse = _mm256_set1_ps(127.0f / amax);
  const __m256 high = _mm256_set1_ps(127.0f), low = _mm256_set1_ps(-127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t j = 0; j < n; ++j) {
    __m256i q[4];
    __m256i total = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      __m256 c = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xs + j * kGroup + 8 * i), inverse),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      c = _mm256_min_ps(high, _mm256_max_ps(low, c));
      q[i] = _mm256_cvtps_epi32(c);
      total = _mm256_add_epi32(total, q[i]);
    }
    // Packing works within 128-bit lanes: put the 4-byte pieces back in order.
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                              _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + j * kGroup),
                        _mm256_permutevar8x32_epi32(packed, order));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    sums[j] = static_cast<int16_t>(_mm_cvtsi128_si32(t));
  }
}

Activations quantize_rows(const float* x, int64_t rows, int64_t k) {
  const int64_t groups = k / kGroup, supers = supers_of(groups);
  Activations a{std::vector<int8_t>(rows * k), std::vector<float>(rows * supers),
                std::vector<int16_t>(rows * supers * kSuper), supers};
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / k);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t s = 0; s < supers; ++s) {
        const int64_t n = std::min(kSuper, groups - s * kSuper);
        const int64_t at = r * k + s * kSuper * kGroup;
        quantize_super(x + at, n, a.codes.data() + at, &a.scale[r * supers + s],
                       &a.sums[(r * supers + s) * kSuper]);
      }
    }
  });
  return a;
}

// acc + the dot products of each 32-bit lane of w (4 unsigned bytes) with the 4 signed bytes
// at p, broadcast from memory inside the instruction (compilers do not fold the broadcast).
__attribute__((target("avx512f,avx512vnni"))) inline __m512i dpbusd_broadcast(__m512i acc,
                                                                           __m512i w,
                                                                           const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(w), "m"(*reinterpret_cast<const int32_t(*)[1]>(p)));
  return acc;
}

// Rows of a block go in tiles of up to kTile, their integer sums in registers; the block's
// records are read again (from cache) for each tile.
constexpr int kTile = 8;
// From this many rows a tile prefetches the next block: it computes long enough per group for
// the lines to arrive, and the hardware prefetcher alone left 16-row passes 10% slower. A row
// or two stream at the memory rate without it.
constexpr int64_t kPrefetchRows = 4;

// One block of 16 outputs for rows [first, first + R): out[r * 16 + lane]. 4-bit codes: chunk
// c (of 4) holds inputs 8c..8c+3 in its low nibbles, 8c+4..8c+7 in its high ones; 8-bit codes:
// chunk c (of 8) holds inputs 4c..4c+3.
template <int Bits, int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) inline void tile_avx512_vnni(
    const uint8_t* block, const Activations& a, int64_t first, int64_t k, float* out,
    const uint8_t* next) {
  const int64_t groups = k / kGroup;
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const uint8_t* record = block;
  for (int64_t s = 0; s < a.supers; ++s) {
    const int64_t n = std::min(kSuper, groups - s * kSuper);
    constexpr int64_t kCodeBytes = code_bytes<Bits>();
    const uint8_t* meta = record + n * kCodeBytes;
    __m512i S[R], M[R];
    for (int r = 0; r < R; ++r) S[r] = M[r] = _mm512_setzero_si512();
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* codes = record + j * kCodeBytes;
      if (next != nullptr) {  // the next block's group, into L1 while this one computes
        const char* ahead = reinterpret_cast<const char*>(next + (codes - block));
        for (int line = 0; line < kCodeBytes / 64; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
      }
      // w[2c] and w[2c + 1] multiply the activation bytes at 8c and 8c + 4.
      __m512i w[8];
      for (int c = 0; c < 4; ++c) {
        if constexpr (Bits == 4) {
          const __m512i v = _mm512_loadu_si512(codes + 64 * c);
          w[2 * c] = _mm512_and_si512(v, low_mask);
          w[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low_mask);
        } else {
          w[2 * c] = _mm512_loadu_si512(codes + 128 * c);
          w[2 * c + 1] = _mm512_loadu_si512(codes + 128 * c + 64);
        }
      }
      const __m512i sc =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta + 16 * j)));
      for (int r = 0; r < R; ++r) {
        const int8_t* p = a.codes.data() + (first + r) * k + (s * kSuper + j) * kGroup;
        __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
          d0 = dpbusd_broadcast(d0, w[2 * c], p + 8 * c);
          d1 = dpbusd_broadcast(d1, w[2 * c + 1], p + 8 * c + 4);
        }
        S[r] = _mm512_add_epi32(S[r], _mm512_mullo_epi32(_mm512_add_epi32(d0, d1), sc));
      }
    }
    for (int64_t pair = 0; pair < (n + 1) / 2; ++pair) {
      const __m512i mn = _mm512_cvtepi8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(meta + 128 + 32 * pair)));
      for (int r = 0; r < R; ++r) {
        int32_t sums;
        std::memcpy(&sums, &a.sums[((first + r) * a.supers + s) * kSuper + 2 * pair], 4);
        M[r] = _mm512_dpwssd_epi32(M[r], mn, _mm512_set1_epi32(sums));
      }
    }
    const __m512 d = _mm512_loadu_ps(reinterpret_cast<const float*>(meta + 256));
    const __m512 dmin = _mm512_loadu_ps(reinterpret_cast<const float*>(meta + 320));
    for (int r = 0; r < R; ++r) {
      const __m512 t = _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(S[r])),
                                     _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(M[r])));
      acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(t, _mm512_set1_ps(a.scale[(first + r) * a.supers + s])));
    }
    record = meta + kMetaBytes;
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * kLanes, acc[r]);
}

// The same sums with AVX2, 8 outputs (half a block) at a time: u8 x s8 pairs into int16, then
// pairs into int32: the dot products VNNI computes. The int16 pair sums are exact for 4-bit
// codes (2 * 15 * 127); 8-bit codes go as their two nibbles, 16 * dot(high) + dot(low), for the
// same reason.
template <int Bits, int R>
__attribute__((target("avx2,fma,f16c"))) inline void tile_avx2(const uint8_t* block,
                                                               const Activations& a,
                                                               int64_t first, int64_t k,
                                                               float* out) {
  const int64_t groups = k / kGroup;
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int half = 0; half < 2; ++half) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const uint8_t* record = block;
    for (int64_t s = 0; s < a.supers; ++s) {
      const int64_t n = std::min(kSuper, groups - s * kSuper);
      constexpr int64_t kCodeBytes = code_bytes<Bits>();
      constexpr int kChunks = Bits == 4 ? 4 : 8;
      const uint8_t* meta = record + n * kCodeBytes;
      __m256i S[R], M[R];
      for (int r = 0; r < R; ++r) S[r] = M[r] = _mm256_setzero_si256();
      for (int64_t j = 0; j < n; ++j) {
        const uint8_t* codes = record + j * kCodeBytes;
        // 4 bits: lo[c], hi[c] multiply the activations at 8c and 8c + 4. 8 bits: chunk c's
        // low and high nibbles, both against the activations at 4c.
        __m256i lo[kChunks], hi[kChunks];
        for (int c = 0; c < kChunks; ++c) {
          const __m256i v =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * c + 32 * half));
          lo[c] = _mm256_and_si256(v, low_mask);
          hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_mask);
        }
        const __m256i sc = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(meta + 16 * j + 8 * half)));
        for (int r = 0; r < R; ++r) {
          const int8_t* p = a.codes.data() + (first + r) * k + (s * kSuper + j) * kGroup;
          __m256i d = _mm256_setzero_si256();
          if constexpr (Bits == 4) {
            for (int c = 0; c < 4; ++c) {
              int32_t first4, second4;
              std::memcpy(&first4, p + 8 * c, 4);
              std::memcpy(&second4, p + 8 * c + 4, 4);
              const __m256i a0 = _mm256_maddubs_epi16(lo[c], _mm256_set1_epi32(first4));
              const __m256i a1 = _mm256_maddubs_epi16(hi[c], _mm256_set1_epi32(second4));
              d = _mm256_add_epi32(d, _mm256_madd_epi16(_mm256_add_epi16(a0, a1), ones));
            }
          } else {
            __m256i low = _mm256_setzero_si256(), high = _mm256_setzero_si256();
            for (int c = 0; c < 8; ++c) {
              int32_t four;
              std::memcpy(&four, p + 4 * c, 4);
              const __m256i b = _mm256_set1_epi32(four);
              low = _mm256_add_epi32(low, _mm256_madd_epi16(_mm256_maddubs_epi16(lo[c], b), ones));
              high = _mm256_add_epi32(high,
                                      _mm256_madd_epi16(_mm256_maddubs_epi16(hi[c], b), ones));
            }
            d = _mm256_add_epi32(low, _mm256_slli_epi32(high, 4));
          }
          S[r] = _mm256_add_epi32(S[r], _mm256_mullo_epi32(d, sc));
        }
      }
      for (int64_t pair = 0; pair < (n + 1) / 2; ++pair) {
        const __m256i mn = _mm256_cvtepi8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(meta + 128 + 32 * pair + 16 * half)));
        for (int r = 0; r < R; ++r) {
          int32_t sums;
          std::memcpy(&sums, &a.sums[((first + r) * a.supers + s) * kSuper + 2 * pair], 4);
          M[r] = _mm256_add_epi32(M[r], _mm256_madd_epi16(mn, _mm256_set1_epi32(sums)));
        }
      }
      const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(meta + 256) + 8 * half);
      const __m256 dmin = _mm256_loadu_ps(reinterpret_cast<const float*>(meta + 320) + 8 * half);
      for (int r = 0; r < R; ++r) {
        const __m256 t = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(S[r])),
                                       _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(M[r])));
        acc[r] = _mm256_add_ps(
            acc[r], _mm256_mul_ps(t, _mm256_set1_ps(a.scale[(first + r) * a.supers + s])));
      }
      record = meta + kMetaBytes;
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * kLanes + 8 * half, acc[r]);
  }
}

template <int Bits, int R>
struct Avx512Vnni {
  static void run(const uint8_t* b, const Activations& a, int64_t first, int64_t k, float* out,
                  const uint8_t* next) {
    tile_avx512_vnni<Bits, R>(b, a, first, k, out, next);
  }
};

template <int Bits, int R>
struct Avx2 {
  static void run(const uint8_t* b, const Activations& a, int64_t first, int64_t k, float* out,
                  const uint8_t*) {
    tile_avx2<Bits, R>(b, a, first, k, out);
  }
};

// The last tile, of n < kTile rows.
template <template <int, int> class Tile, int Bits, int R>
inline void dispatch_rest(int64_t n, const uint8_t* block, const Activations& a, int64_t first,
                          int64_t k, float* out, const uint8_t* next) {
  if constexpr (R > 0) {
    if (n == R) return Tile<Bits, R>::run(block, a, first, k, out, next);
    dispatch_rest<Tile, Bits, R - 1>(n, block, a, first, k, out, next);
  }
}

// One block of 16 outputs for every row, in tiles of kTile and one tile of the rest.
template <template <int, int> class Tile, int Bits>
void run_block(const uint8_t* block, const Activations& a, int64_t rows, int64_t k, float* out,
               const uint8_t* next) {
  int64_t first = 0;
  for (; first + kTile <= rows; first += kTile) {
    Tile<Bits, kTile>::run(block, a, first, k, out + first * kLanes, first == 0 ? next : nullptr);
  }
  float* rest = out + first * kLanes;
  dispatch_rest<Tile, Bits, kTile - 1>(rows - first, block, a, first, k, rest, first == 0 ? next : nullptr);
}

enum Path : int64_t { kAuto = 0, kAvx512Vnni = 1, kAvx2 = 2 };

bool supported(int64_t path) {
  __builtin_cpu_init();
  switch (path) {
    case kAvx512Vnni:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    case kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    default:
      return false;
  }
}

// The fastest path this CPU runs (0: none, use the PyTorch reference).
int64_t best_path() {
  if (supported(kAvx512Vnni)) return kAvx512Vnni;
  if (supported(kAvx2)) return kAvx2;
  return kAuto;
}

bool path_supported(int64_t path) { return supported(path); }

at::Tensor superblock_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, int64_t k,
                             const std::optional<at::Tensor>& bias, int64_t path,
                             int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8, "superblock_linear: bits must be 4 or 8");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == k, "superblock_linear: x must be [rows, ", k, "]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "superblock_linear: x must be contiguous float32 on CPU");
  TORCH_CHECK(k % kGroup == 0, "superblock_linear: in_features must be a multiple of 32");
  const int64_t blocks = (n + kLanes - 1) / kLanes, stride = block_bytes(k, bits);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.numel() == blocks * stride,
              "superblock_linear: packed weights do not match ", n, " x ", k);
  TORCH_CHECK(path != kAuto && supported(path), "superblock_linear: this CPU cannot run path ",
              path);
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "superblock_linear: bias must be [", n, "] float32");
    b = bias->data_ptr<float>();
  }
  const int64_t rows = x.size(0);
  at::Tensor out = at::empty({rows, n}, x.options());
  if (rows == 0) return out;
  const Activations a = quantize_rows(x.data_ptr<float>(), rows, k);
  const uint8_t* weights = packed.data_ptr<uint8_t>();
  float* y = out.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(rows * kLanes);
    for (int64_t block = begin; block < end; ++block) {
      const uint8_t* records = weights + block * stride;
      const uint8_t* next = block + 1 < end && rows >= kPrefetchRows ? records + stride : nullptr;
      if (path == kAvx512Vnni) {
        (bits == 4 ? run_block<Avx512Vnni, 4> : run_block<Avx512Vnni, 8>)(records, a, rows, k,
                                                                          acc.data(), next);
      } else {
        (bits == 4 ? run_block<Avx2, 4> : run_block<Avx2, 8>)(records, a, rows, k, acc.data(),
                                                              next);
      }
      const int64_t first = block * kLanes;
      const int64_t lanes = std::min(kLanes, n - first);
      for (int64_t r = 0; r < rows; ++r) {
        float* dst = y + r * n + first;
        const float* src = acc.data() + r * kLanes;
        if (b == nullptr) {
          std::memcpy(dst, src, lanes * sizeof(float));
        } else {
          for (int64_t j = 0; j < lanes; ++j) dst[j] = src[j] + b[first + j];
        }
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(quickdraft_kernels, m) {
  m.def("superblock_linear(Tensor x, Tensor packed, int n, int k, Tensor? bias, int path, "
        "int bits) "
        "-> Tensor");
  m.def("supported(int path) -> bool", &path_supported);
  m.def("best_path() -> int", &best_path);
}

TORCH_LIBRARY_IMPL(quickdraft_kernels, CPU, m) {
  m.impl("superblock_linear", &superblock_linear);
}
