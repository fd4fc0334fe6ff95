// Decode attention straight from the paged KV cache: `torch.ops.edgerun.paged_decode_attention`.
//
// model.py's torch path attends a step's single-token rows with SDPA over keys gathered per layer: every
// row's blocks copied out of the cache (attention.py's read_blocks) into a padded [B, L, 2, KH, hd] tensor,
// then flash attention for a query of 1 token. At 16 streams of ~150-token contexts that copy and SDPA were
// about a third of a decode step's CPU (py-spy, AVX2, 2026-12-07). Here each row reads its keys and values where
// they are, once, with no copy and no padding:
//
//   scores[j, p] = q[j] . k[p] / sqrt(hd)      for the kv head's group of query heads j, positions p < context
//   out[j]       = sum_p softmax(scores[j])[p] * v[p]
//
// The cache is [num_blocks, block_size, 2, KH, hd] float32 (attention.py); position p of row t lives in block
// block_tables[t, p / block_size], slot p % block_size. Rows split over torch's threads (at::parallel_for), so a
// step worker's one thread runs them all.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

float dot_product(const float* a, const float* b, int64_t n) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
  }
  for (; i + 8 <= n; i += 8) lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
  const __m256 both = _mm256_add_ps(lo, hi);
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(both), _mm256_extractf128_ps(both, 1));
  r = _mm_hadd_ps(r, r);
  r = _mm_hadd_ps(r, r);
  float sum = _mm_cvtss_f32(r);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// acc[0 .. n) += w * v[0 .. n)
void scaled_add(float* acc, float w, const float* v, int64_t n) {
  const __m256 wv = _mm256_set1_ps(w);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
  for (; i < n; ++i) acc[i] += w * v[i];
}

// q [rows, H * hd] (rows may be strided: a view of the qkv buffer), kv_cache [NB, BS, 2, KH, hd], context_lens [rows],
// block_tables [rows, max_blocks] -> [rows, H * hd]: each row's query heads attending its positions 0 .. context - 1
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& context_lens,
                                  const at::Tensor& block_tables) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kFloat && q.device().is_cpu() && q.stride(1) == 1,
              "q must be a 2-D float32 CPU tensor with contiguous rows");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(2) == 2 && kv_cache.scalar_type() == at::kFloat && kv_cache.is_contiguous(),
              "kv_cache must be a contiguous float32 [blocks, block_size, 2, KH, hd]");
  const int64_t rows = q.size(0), num_blocks = kv_cache.size(0), block_size = kv_cache.size(1);
  const int64_t kv_heads = kv_cache.size(3), hd = kv_cache.size(4);
  TORCH_CHECK(q.size(1) % (kv_heads * hd) == 0, "q's width must be a multiple of KH * hd");
  const int64_t heads = q.size(1) / hd, group = heads / kv_heads;
  TORCH_CHECK(context_lens.scalar_type() == at::kLong && context_lens.is_contiguous() && context_lens.numel() == rows,
              "context_lens must be int64 [rows]");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.is_contiguous() && block_tables.dim() == 2 &&
                  block_tables.size(0) == rows, "block_tables must be int64 [rows, max_blocks]");
  const int64_t max_blocks = block_tables.size(1);
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  for (int64_t t = 0; t < rows; ++t) {
    TORCH_CHECK(lens[t] >= 1 && lens[t] <= max_blocks * block_size, "context length ", lens[t], " of row ", t,
                " is outside its block table");
    for (int64_t b = 0; b < (lens[t] + block_size - 1) / block_size; ++b)
      TORCH_CHECK(tables[t * max_blocks + b] >= 0 && tables[t * max_blocks + b] < num_blocks, "block id out of range");
  }
  at::Tensor out = at::empty({rows, heads * hd}, q.options().memory_format(at::MemoryFormat::Contiguous));
  const float* qs = q.data_ptr<float>();
  const int64_t q_stride = q.stride(0);
  const float* cache = kv_cache.data_ptr<float>();
  float* outs = out.data_ptr<float>();
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  const int64_t position_floats = 2 * kv_heads * hd, block_floats = block_size * position_floats;

  // One task per row, its blocks in order: a block's keys and values (block_size positions, k then v of every kv
  // head) are one contiguous run, read from memory once, while the next block's is prefetched. Softmax online
  // per block (flash attention's running max and sum), so nothing is re-read.
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(heads * block_size), top(heads), total(heads);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t context = lens[t];
      const int64_t* blocks = tables + t * max_blocks;
      const float* qt = qs + t * q_stride;  // [H, hd]
      float* ot = outs + t * heads * hd;    // [H, hd]: the unnormalised sums until the end
      std::fill(ot, ot + heads * hd, 0.f);
      std::fill(top.begin(), top.end(), -std::numeric_limits<float>::infinity());
      std::fill(total.begin(), total.end(), 0.f);
      for (int64_t b = 0; b * block_size < context; ++b) {
        const float* base = cache + blocks[b] * block_floats;
        const int64_t n = std::min(block_size, context - b * block_size);
        if ((b + 1) * block_size < context)
          for (int64_t i = 0; i < block_floats; i += 16)
            _mm_prefetch(reinterpret_cast<const char*>(cache + blocks[b + 1] * block_floats + i), _MM_HINT_T1);
        for (int64_t p = 0; p < n; ++p)
          for (int64_t h = 0; h < heads; ++h)
            scores[h * block_size + p] = dot_product(qt + h * hd, base + p * position_floats + (h / group) * hd, hd) * scale;
        for (int64_t h = 0; h < heads; ++h) {
          float* s = scores.data() + h * block_size;
          const float now = std::max(top[h], *std::max_element(s, s + n));
          const float kept = std::exp(top[h] - now);  // 0 at the first block
          float sum = 0.f;
          for (int64_t p = 0; p < n; ++p) sum += (s[p] = std::exp(s[p] - now));
          total[h] = total[h] * kept + sum;
          top[h] = now;
          if (kept != 1.f)
            for (int64_t i = 0; i < hd; ++i) ot[h * hd + i] *= kept;
        }
        for (int64_t p = 0; p < n; ++p) {
          const float* v = base + p * position_floats + kv_heads * hd;
          for (int64_t h = 0; h < heads; ++h) scaled_add(ot + h * hd, scores[h * block_size + p], v + (h / group) * hd, hd);
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        const float inv = 1.f / total[h];
        for (int64_t i = 0; i < hd; ++i) ot[h * hd + i] *= inv;
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(edgerun, m) {
  m.def("paged_decode_attention(Tensor q, Tensor kv_cache, Tensor context_lens, Tensor block_tables) -> Tensor");
}

TORCH_LIBRARY_IMPL(edgerun, CPU, m) { m.impl("paged_decode_attention", paged_decode_attention); }
