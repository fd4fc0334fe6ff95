// A whole decode step of a Llama model in one call: edgerun's fast path for a few single-token rows.
//
// model.py runs a step as ~20 torch ops per layer; at one row each op costs more in dispatch than in
// arithmetic. This runs the same maths for rows of one new token each (their own sequences), with every
// linear weight in the q4_1 format (block_gemv.h: Q4_1 decoder, Q8_0 head) and a float32 paged KV cache:
//
//   per layer:  h = rms_norm(x) * attn_norm;  qkv = h @ Wqkv.T;  rope(q, k) at the row's position;
//               k, v -> the cache slot of that position;  a = softmax(q k^T / sqrt(hd)) v over the row's
//               context (grouped-query: query head j reads kv head j / (H / KH));  x += a @ Wo.T
//               h = rms_norm(x) * mlp_norm;  [g, u] = h @ Wgate_up.T;  x += (silu(g) * u) @ Wdown.T
//   then:       logits = rms_norm(x) * norm @ Whead.T
//
// Rows may run under LoRA adapters (runner/lora.py): after a linear's base matmul, each term (layer, linear,
// columns [start, end), the module's slot buffers A [S, R, in] and B [S, end - start, R]) adds a row's delta
// y[start:end] += B[s] (A[s] x) at rank r for the row's slot s; rows of slot -1 are untouched (lora_delta).
//
// The cache is [num_blocks, block_size, 2, KH, hd] float32 (attention.py); position p of a row lives in
// slot block_table[p / block_size] * block_size + p % block_size. Rope pairs are interleaved (weights.py):
// (x[2i], x[2i+1]) turns by pos * inv_freq[i]. The matmuls split output rows over torch's threads
// (at::parallel_for), attention splits its (row, kv head) pairs.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "block_gemv.h"

namespace {

// per layer: attn_norm, codes and scales of qkv and of o, mlp_norm, codes and scales of gate_up and of down
constexpr int64_t kLayerTensors = 10;

struct Q4Weight {
  const uint8_t* codes;
  const uint16_t* scales;
  int64_t out;
};

Q4Weight q4_weight(const at::Tensor& codes, const at::Tensor& scales, int64_t in) {
  const int64_t out = edgerun::check_q4_1_weight(codes, scales, in);
  return {codes.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(scales.data_ptr()), out};
}

const float* norm_weight(const at::Tensor& w, int64_t d) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.numel() == d, "norm weights must be float32 [", d, "]");
  return w.data_ptr<float>();
}

float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  float sum = _mm_cvtss_f32(r);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w    x, out: [rows, d]
void rms_norm(const float* x, const float* w, int64_t rows, int64_t d, float eps, float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* xt = x + t * d;
    const float inv = 1.f / std::sqrt(dot(xt, xt, d) / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) out[t * d + i] = xt[i] * inv * w[i];
  }
}

// The shape of the model and of one step's rows, and where each row's keys live.
struct Step {
  int64_t rows, d, heads, kv_heads, hd, inter;
  int64_t block_size, max_blocks;
  float eps;
  const int64_t* positions;     // [rows]
  const int64_t* block_tables;  // [rows, max_blocks]
  const float* inv_freq;        // [hd / 2]

  int64_t slot(int64_t t, int64_t pos) const {
    return block_tables[t * max_blocks + pos / block_size] * block_size + pos % block_size;
  }
};

// qkv [rows, (H + 2KH) * hd]: rope on the q and k heads, in place
void rope(const Step& s, float* qkv) {
  const int64_t width = (s.heads + 2 * s.kv_heads) * s.hd, half = s.hd / 2;
  std::vector<float> cos_sin(2 * half);
  for (int64_t t = 0; t < s.rows; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(s.positions[t]) * s.inv_freq[i];
      cos_sin[2 * i] = std::cos(angle);
      cos_sin[2 * i + 1] = std::sin(angle);
    }
    for (int64_t h = 0; h < s.heads + s.kv_heads; ++h) {
      float* v = qkv + t * width + h * s.hd;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1], c = cos_sin[2 * i], sn = cos_sin[2 * i + 1];
        v[2 * i] = a * c - b * sn;
        v[2 * i + 1] = a * sn + b * c;
      }
    }
  }
}

// the cache lines of n floats from x, into L1 ahead of use: the keys and values of a position are
// kv_width floats apart from the next's, a stride the hardware prefetcher does not run far enough ahead on
constexpr int64_t kAhead = 4;  // positions

void prefetch(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) _mm_prefetch(reinterpret_cast<const char*>(x + i), _MM_HINT_T0);
}

// k and v of each row's new token -> its cache slot; then out [rows, H * hd] = attention of its q heads
void attend(const Step& s, const float* qkv, float* cache, float* out) {
  const int64_t width = (s.heads + 2 * s.kv_heads) * s.hd, kv_width = s.kv_heads * s.hd;
  for (int64_t t = 0; t < s.rows; ++t) {
    float* slot = cache + s.slot(t, s.positions[t]) * 2 * kv_width;
    std::copy_n(qkv + t * width + s.heads * s.hd, 2 * kv_width, slot);  // k heads then v heads, as the cache
  }
  // one task per (row, kv head): the kv head's group of query heads read each key and value once
  const float scale = 1.f / std::sqrt(static_cast<float>(s.hd));
  const int64_t group = s.heads / s.kv_heads;
  at::parallel_for(0, s.rows * s.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(group * s.hd);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / s.kv_heads, g = task % s.kv_heads;
      const int64_t context = s.positions[t] + 1;
      const float* q = qkv + t * width + g * group * s.hd;  // [group, hd]: query heads g * group ...
      scores.resize(group * context);  // [group, context]
      for (int64_t p = 0; p < context; ++p) {
        const float* k = cache + s.slot(t, p) * 2 * kv_width + g * s.hd;
        if (p + kAhead < context) prefetch(cache + s.slot(t, p + kAhead) * 2 * kv_width + g * s.hd, s.hd);
        for (int64_t j = 0; j < group; ++j) scores[j * context + p] = dot(q + j * s.hd, k, s.hd) * scale;
      }
      for (int64_t j = 0; j < group; ++j) {  // softmax over each head's scores, in place
        float* row = scores.data() + j * context;
        const float top = *std::max_element(row, row + context);
        float total = 0.f;
        for (int64_t p = 0; p < context; ++p) total += (row[p] = std::exp(row[p] - top));
        for (int64_t p = 0; p < context; ++p) row[p] /= total;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t p = 0; p < context; ++p) {
        const float* v = cache + s.slot(t, p) * 2 * kv_width + kv_width + g * s.hd;
        if (p + kAhead < context) prefetch(cache + s.slot(t, p + kAhead) * 2 * kv_width + kv_width + g * s.hd, s.hd);
        for (int64_t j = 0; j < group; ++j) {
          const float e = scores[j * context + p];
          float* a = acc.data() + j * s.hd;
          for (int64_t i = 0; i < s.hd; ++i) a[i] += e * v[i];
        }
      }
      std::copy(acc.begin(), acc.end(), out + t * s.heads * s.hd + g * group * s.hd);
    }
  });
}

// OpenMP threads of the calling thread for this scope (at::parallel_for reads them), restored at its end
struct ThreadCount {
  int before;
  explicit ThreadCount(int64_t n) : before(omp_get_max_threads()) {
    if (n > 0) omp_set_num_threads(static_cast<int>(n));
  }
  ~ThreadCount() { omp_set_num_threads(before); }
};

// x [rows, d] += y [rows, d]
void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// The step's LoRA terms (see the top): per layer and linear (qkv 0, o 1, gate_up 2, down 3), those to add
struct Lora {
  struct Term {
    const float* a;  // [S, R, in]
    const float* b;  // [S, cols, R]
    int64_t start, cols;
  };
  std::vector<std::vector<Term>> by_linear;  // [layer * 4 + linear]
  const int64_t* slots = nullptr;            // [rows]: each row's adapter slot, -1 for none
  int64_t rank = 0, max_rank = 0;

  // y [rows, out] += each row's delta of `linear` in `layer`; x [rows, in] is the linear's input. One task per
  // (row, term): the terms of a linear write disjoint columns, so each output is one task's, in one order.
  void add(int64_t layer, int64_t linear, const float* x, int64_t rows, int64_t in, float* y, int64_t out) const {
    if (slots == nullptr) return;
    const std::vector<Term>& terms = by_linear[layer * 4 + linear];
    const int64_t num_terms = static_cast<int64_t>(terms.size());
    if (num_terms == 0) return;
    at::parallel_for(0, rows * num_terms, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> h(rank);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t t = task / num_terms, slot = slots[t];
        if (slot < 0) continue;
        const Term& term = terms[task % num_terms];
        const float* a = term.a + slot * max_rank * in;
        const float* b = term.b + slot * term.cols * max_rank;
        for (int64_t j = 0; j < rank; ++j) h[j] = dot(a + j * in, x + t * in, in);  // h = A x   [r]
        float* yt = y + t * out + term.start;
        for (int64_t c = 0; c < term.cols; ++c) yt[c] += dot(b + c * max_rank, h.data(), rank);  // y += B h
      }
    });
  }
};

Lora lora_terms(at::TensorList a, at::TensorList b, at::IntArrayRef terms, const c10::optional<at::Tensor>& slots,
                int64_t rank, int64_t rows, int64_t num_layers, const int64_t (&linear_in)[4], const int64_t (&linear_out)[4]) {
  Lora lora;
  lora.by_linear.resize(num_layers * 4);
  if (!slots.has_value() || a.empty()) return lora;
  TORCH_CHECK(static_cast<int64_t>(terms.size()) == 4 * static_cast<int64_t>(a.size()) && a.size() == b.size(),
              "lora: 4 ints (layer, linear, start, end) and one A and one B per term");
  TORCH_CHECK(slots->scalar_type() == at::kLong && slots->is_contiguous() && slots->numel() == rows, "lora_slots must be int64 [rows]");
  const int64_t num_slots = a[0].size(0), max_rank = a[0].dim() == 3 ? a[0].size(1) : 0;
  TORCH_CHECK(rank >= 0 && rank <= max_rank, "lora rank ", rank, " is outside the buffers' ", max_rank);
  const int64_t* row_slots = slots->data_ptr<int64_t>();
  for (int64_t t = 0; t < rows; ++t) TORCH_CHECK(row_slots[t] >= -1 && row_slots[t] < num_slots, "lora slot out of range");
  for (size_t i = 0; i < a.size(); ++i) {
    const int64_t layer = terms[4 * i], linear = terms[4 * i + 1], start = terms[4 * i + 2], end = terms[4 * i + 3];
    TORCH_CHECK(layer >= 0 && layer < num_layers && linear >= 0 && linear < 4 && start >= 0 && start < end &&
                    end <= linear_out[linear], "lora term ", i, " names no columns of the model");
    const int64_t cols = end - start;
    TORCH_CHECK(a[i].scalar_type() == at::kFloat && a[i].is_contiguous() && a[i].dim() == 3 &&
                    a[i].sizes() == at::IntArrayRef({num_slots, max_rank, linear_in[linear]}),
                "lora A of term ", i, " must be contiguous float32 [slots, rank, in]");
    TORCH_CHECK(b[i].scalar_type() == at::kFloat && b[i].is_contiguous() && b[i].dim() == 3 &&
                    b[i].sizes() == at::IntArrayRef({num_slots, cols, max_rank}),
                "lora B of term ", i, " must be contiguous float32 [slots, end - start, rank]");
    lora.by_linear[layer * 4 + linear].push_back({a[i].data_ptr<float>(), b[i].data_ptr<float>(), start, cols});
  }
  lora.slots = row_slots;
  lora.rank = rank;
  lora.max_rank = max_rank;
  return lora;
}

// One step: x [rows, d] (the new tokens' embeddings) -> (logits [rows, vocab], the residual stream after
// each layer of aux_layers [rows, len(aux_layers) * d]; [rows, 0] without), on num_threads threads (0: torch's)
std::tuple<at::Tensor, at::Tensor> decode_step(const at::Tensor& x_in, at::TensorList layers, at::TensorList kv_caches,
                                               const at::Tensor& positions, const at::Tensor& block_tables,
                                               const at::Tensor& inv_freq, const at::Tensor& norm,
                                               const at::Tensor& head_codes, const at::Tensor& head_scales,
                                               at::IntArrayRef aux_layers, int64_t num_heads, int64_t num_kv_heads,
                                               double eps, int64_t num_threads, at::TensorList lora_a,
                                               at::TensorList lora_b, at::IntArrayRef lora_terms_,
                                               const c10::optional<at::Tensor>& lora_slots, int64_t lora_rank) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && x_in.device().is_cpu(), "x must be a 2-D float32 CPU tensor");
  const int64_t rows = x_in.size(0), d = x_in.size(1), num_layers = static_cast<int64_t>(kv_caches.size());
  TORCH_CHECK(num_layers > 0 && static_cast<int64_t>(layers.size()) == kLayerTensors * num_layers,
              "one kv cache per layer and ", kLayerTensors, " tensors per layer in `layers`");
  TORCH_CHECK(d % 32 == 0, "hidden size must be a multiple of 32, got ", d);
  TORCH_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "num_heads (", num_heads, ") must be a multiple of num_kv_heads (",
              num_kv_heads, ")");
  const at::Tensor& cache0 = kv_caches[0];
  TORCH_CHECK(cache0.dim() == 5 && cache0.size(2) == 2 && cache0.size(3) == num_kv_heads, "kv caches must be [blocks, block_size, 2, KH, hd]");
  const int64_t hd = cache0.size(4), block_size = cache0.size(1);
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() && positions.numel() == rows, "positions must be int64 [rows]");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.is_contiguous() && block_tables.dim() == 2 &&
                  block_tables.size(0) == rows, "block_tables must be int64 [rows, max_blocks]");
  TORCH_CHECK(inv_freq.scalar_type() == at::kFloat && inv_freq.is_contiguous() && inv_freq.numel() == hd / 2, "inv_freq must be float32 [hd / 2]");
  const int64_t vocab = edgerun::check_q8_0_weight(head_codes, head_scales, d);
  for (const int64_t layer : aux_layers)  // else its columns of aux would be left unwritten
    TORCH_CHECK(layer >= 0 && layer < num_layers, "aux layer ", layer, " is outside the model's ", num_layers, " layers");
  const int64_t max_blocks = block_tables.size(1);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  for (int64_t t = 0; t < rows; ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_blocks * block_size, "position ", pos[t], " is outside row ", t, "'s block table");
    for (int64_t b = 0; b <= pos[t] / block_size; ++b)
      TORCH_CHECK(tables[t * max_blocks + b] >= 0 && tables[t * max_blocks + b] < cache0.size(0), "block id out of range");
  }
  const int64_t inter = layers[7].size(1) / 4;  // gate_up scales: [K/32, 2 * 2I]
  const Step s{rows, d, num_heads, num_kv_heads, hd, inter, block_size, max_blocks, static_cast<float>(eps), pos, tables,
               inv_freq.data_ptr<float>()};
  const int64_t qkv_width = (num_heads + 2 * num_kv_heads) * hd;
  const int64_t linear_in[4] = {d, num_heads * hd, d, inter}, linear_out[4] = {qkv_width, d, 2 * inter, d};
  const Lora lora = lora_terms(lora_a, lora_b, lora_terms_, lora_slots, lora_rank, rows, num_layers, linear_in, linear_out);

  const ThreadCount threads(num_threads);
  at::Tensor x = x_in.contiguous().clone();
  at::Tensor aux = at::empty({rows, static_cast<int64_t>(aux_layers.size()) * d}, x.options());
  float* xs = x.data_ptr<float>();
  std::vector<float> h(rows * std::max(d, inter)), qkv(rows * qkv_width), attn(rows * num_heads * hd), y(rows * d),
      gate_up(rows * 2 * inter);
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const at::TensorList w = layers.slice(layer * kLayerTensors, kLayerTensors);
    const at::Tensor& cache = kv_caches[layer];
    TORCH_CHECK(cache.scalar_type() == at::kFloat && cache.is_contiguous() && cache.sizes() == cache0.sizes(),
                "kv caches must be contiguous float32, all of one shape");
    const Q4Weight wqkv = q4_weight(w[1], w[2], d), wo = q4_weight(w[3], w[4], num_heads * hd);
    const Q4Weight wgu = q4_weight(w[6], w[7], d), wdown = q4_weight(w[8], w[9], inter);
    TORCH_CHECK(wqkv.out == qkv_width && wo.out == d && wgu.out == 2 * inter && wdown.out == d, "layer ", layer,
                "'s weights do not match the model's shape");

    rms_norm(xs, norm_weight(w[0], d), rows, d, s.eps, h.data());
    edgerun::q4_1_matmul(h.data(), rows, d, wqkv.codes, wqkv.scales, qkv_width, qkv.data());
    lora.add(layer, 0, h.data(), rows, d, qkv.data(), qkv_width);
    rope(s, qkv.data());
    attend(s, qkv.data(), cache.data_ptr<float>(), attn.data());
    edgerun::q4_1_matmul(attn.data(), rows, num_heads * hd, wo.codes, wo.scales, d, y.data());
    lora.add(layer, 1, attn.data(), rows, num_heads * hd, y.data(), d);
    add(xs, y.data(), rows * d);

    rms_norm(xs, norm_weight(w[5], d), rows, d, s.eps, h.data());
    edgerun::q4_1_matmul(h.data(), rows, d, wgu.codes, wgu.scales, 2 * inter, gate_up.data());
    lora.add(layer, 2, h.data(), rows, d, gate_up.data(), 2 * inter);
    for (int64_t t = 0; t < rows; ++t) {  // h = silu(gate) * up   [rows, I]
      const float* g = gate_up.data() + t * 2 * inter;
      for (int64_t i = 0; i < inter; ++i) h[t * inter + i] = g[i] / (1.f + std::exp(-g[i])) * g[inter + i];
    }
    edgerun::q4_1_matmul(h.data(), rows, inter, wdown.codes, wdown.scales, d, y.data());
    lora.add(layer, 3, h.data(), rows, inter, y.data(), d);
    add(xs, y.data(), rows * d);

    for (size_t j = 0; j < aux_layers.size(); ++j)
      if (aux_layers[j] == layer)
        for (int64_t t = 0; t < rows; ++t) std::copy_n(xs + t * d, d, aux.data_ptr<float>() + t * aux.size(1) + j * d);
  }

  rms_norm(xs, norm_weight(norm, d), rows, d, s.eps, h.data());
  at::Tensor logits = at::empty({rows, vocab}, x.options());
  edgerun::q8_0_matmul(h.data(), rows, d, head_codes.data_ptr<int8_t>(), reinterpret_cast<const uint16_t*>(head_scales.data_ptr()),
                       vocab, logits.data_ptr<float>());
  return {logits, aux};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(edgerun, m) {
  m.def("decode_step(Tensor x, Tensor[] layers, Tensor(a!)[] kv_caches, Tensor positions, Tensor block_tables, Tensor inv_freq, "
        "Tensor norm, Tensor head_codes, Tensor head_scales, int[] aux_layers, int num_heads, int num_kv_heads, float eps, "
        "int num_threads, Tensor[] lora_a, Tensor[] lora_b, int[] lora_terms, Tensor? lora_slots, int lora_rank) "
        "-> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(edgerun, CPU, m) { m.impl("decode_step", decode_step); }
