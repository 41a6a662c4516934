#include "cc/core/conv.h"

#include <algorithm>
#include <cstring>

#include "cc/core/checked_math.h"
#include "cc/core/gemm.h"

namespace tf_glp::core {
namespace {

// Partial filter gradients may take this many floats in all (256 MiB).
constexpr int64_t kPartialBudget = int64_t{64} << 20;
constexpr int64_t kMaxFilterGradGroups = 32;

std::string Positive(const char* what, int64_t value) {
  return value >= 1 ? "" : std::string(what) + " must be positive, got " + std::to_string(value);
}

// Sums groups partials (each `count` floats, `stride` apart) into out, in
// group order, splitting the elements over the lanes.
void SumPartialsInOrder(const float* partials, int64_t groups, int64_t count,
                        float* out, int64_t num_lanes, const CpuLanePool& pool) {
  constexpr int64_t kChunk = 16384;
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  pool.Run(num_lanes, chunks, [&](int, int64_t chunk) {
    const int64_t begin = chunk * kChunk;
    const int64_t end = std::min(count, begin + kChunk);
    std::memcpy(out + begin, partials + begin, sizeof(float) * (end - begin));
    for (int64_t g = 1; g < groups; ++g) {
      const float* part = partials + g * count;
      for (int64_t i = begin; i < end; ++i) out[i] = out[i] + part[i];
    }
  });
}

}  // namespace

std::string MakeConv2DShape(bool same_padding, Conv2DShape* s) {
  for (const auto& [what, value] :
       {std::pair<const char*, int64_t>{"batch size", s->batch},
        {"input height", s->in_h}, {"input width", s->in_w},
        {"input channels", s->in_c}, {"filter height", s->filter_h},
        {"filter width", s->filter_w}, {"output channels", s->out_c},
        {"stride height", s->stride_h}, {"stride width", s->stride_w},
        {"dilation height", s->dilation_h}, {"dilation width", s->dilation_w}}) {
    std::string error = Positive(what, value);
    if (!error.empty()) return error;
  }
  // Note [Checked sizes]: every size below is checked for overflow.
  const auto overflow = [s](const std::string& what) {
    return "the convolution's " + what + " overflows 64-bit integers (input " +
           std::to_string(s->batch) + "x" + std::to_string(s->in_h) + "x" +
           std::to_string(s->in_w) + "x" + std::to_string(s->in_c) + ", filter " +
           std::to_string(s->filter_h) + "x" + std::to_string(s->filter_w) + "x" +
           std::to_string(s->in_c) + "x" + std::to_string(s->out_c) + ", strides " +
           std::to_string(s->stride_h) + "x" + std::to_string(s->stride_w) +
           ", dilations " + std::to_string(s->dilation_h) + "x" +
           std::to_string(s->dilation_w) + ")";
  };
  int64_t span_h, span_w;  // (filter - 1) * dilation + 1
  int64_t unused;
  if (!CheckedMultiply(s->filter_h - 1, s->dilation_h, &span_h) || !CheckedAdd(span_h, 1, &span_h)) {
    return overflow("dilated filter height");
  }
  if (!CheckedMultiply(s->filter_w - 1, s->dilation_w, &span_w) || !CheckedAdd(span_w, 1, &span_w)) {
    return overflow("dilated filter width");
  }
  if (same_padding) {
    // ceil(in / stride), without forming in + stride - 1.
    s->out_h = s->in_h / s->stride_h + (s->in_h % s->stride_h != 0);
    s->out_w = s->in_w / s->stride_w + (s->in_w % s->stride_w != 0);
    // pad = max(0, (out - 1) * stride + span - in), with (out - 1) * stride
    // < in. The kernels form (out - 1) * stride + (filter - 1) * dilation:
    // it must fit too.
    const int64_t reach_h = (s->out_h - 1) * s->stride_h;
    const int64_t reach_w = (s->out_w - 1) * s->stride_w;
    if (!CheckedAdd(reach_h, span_h, &unused) || !CheckedAdd(reach_w, span_w, &unused)) {
      return overflow("dilated filter span");
    }
    s->pad_top = std::max<int64_t>(0, span_h + (reach_h - s->in_h)) / 2;
    s->pad_left = std::max<int64_t>(0, span_w + (reach_w - s->in_w)) / 2;
  } else {
    if (span_h > s->in_h || span_w > s->in_w) {
      return "with padding \"valid\" the dilated filter (" + std::to_string(span_h) +
             "x" + std::to_string(span_w) + ") must fit in the input (" +
             std::to_string(s->in_h) + "x" + std::to_string(s->in_w) + ")";
    }
    s->out_h = (s->in_h - span_h) / s->stride_h + 1;
    s->out_w = (s->in_w - span_w) / s->stride_w + 1;
    s->pad_top = 0;
    s->pad_left = 0;
  }
  // What the kernels compute from the shape: per-sample and whole-batch
  // element counts (pointer offsets), the flattened filter, and the im2col
  // workspace at the largest lane count.
  if (!CheckedProduct({s->batch, s->in_h, s->in_w, s->in_c}, &unused)) return overflow("input size");
  if (!CheckedProduct({s->batch, s->out_h, s->out_w, s->out_c}, &unused)) return overflow("output size");
  if (!CheckedProduct({s->filter_h, s->filter_w, s->in_c, s->out_c}, &unused)) return overflow("filter size");
  if (!CheckedProduct({kMaxLanes, s->out_h, s->out_w, s->filter_h, s->filter_w, s->in_c}, &unused)) {
    return overflow("im2col workspace");
  }
  return "";
}

int64_t FilterGradGroups(const Conv2DShape& s) {
  const int64_t by_memory = std::max<int64_t>(1, kPartialBudget / std::max<int64_t>(1, s.FilterElements()));
  return std::max<int64_t>(1, std::min({s.batch, kMaxFilterGradGroups, by_memory}));
}

int64_t Conv2DForwardWorkspace(const Conv2DShape& s, int64_t num_lanes) {
  return s.IsPointwise() ? 0 : LanesUsed(num_lanes, s.batch) * s.OutputPixels() * s.PatchSize();
}

int64_t Conv2DBackpropInputWorkspace(const Conv2DShape& s, int64_t num_lanes) {
  return s.IsPointwise() ? 0 : LanesUsed(num_lanes, s.batch) * s.OutputPixels() * s.PatchSize();
}

int64_t Conv2DBackpropFilterWorkspace(const Conv2DShape& s, int64_t num_lanes) {
  const int64_t groups = FilterGradGroups(s);
  return Conv2DForwardWorkspace(s, num_lanes) + (groups > 1 ? groups * s.FilterElements() : 0);
}

// Note [Patch rows]: for one output pixel and filter row kh, the filter_w
// patch entries are in_c-float runs of the input; with dilation_w == 1 and the
// row inside the input they are one contiguous run of filter_w * in_c floats,
// copied (or added) in one loop. Short inline loops, not memcpy calls: with 3
// input channels a call per run costs more than the copy.
void Im2Col(const Conv2DShape& s, const float* sample, float* col) {
  const int64_t patch = s.PatchSize();
  const int64_t row_floats = s.filter_w * s.in_c;
  for (int64_t oh = 0; oh < s.out_h; ++oh) {
    for (int64_t ow = 0; ow < s.out_w; ++ow) {
      float* dst = col + (oh * s.out_w + ow) * patch;
      const int64_t iw0 = ow * s.stride_w - s.pad_left;
      const bool contiguous = s.dilation_w == 1 && iw0 >= 0 && iw0 + s.filter_w <= s.in_w;
      for (int64_t kh = 0; kh < s.filter_h; ++kh, dst += row_floats) {
        const int64_t ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
        if (ih < 0 || ih >= s.in_h) {
          for (int64_t i = 0; i < row_floats; ++i) dst[i] = 0.0f;
          continue;
        }
        const float* row = sample + ih * s.in_w * s.in_c;
        if (contiguous) {
          const float* src = row + iw0 * s.in_c;
          for (int64_t i = 0; i < row_floats; ++i) dst[i] = src[i];
          continue;
        }
        for (int64_t kw = 0; kw < s.filter_w; ++kw) {
          const int64_t iw = iw0 + kw * s.dilation_w;
          float* out = dst + kw * s.in_c;
          if (iw < 0 || iw >= s.in_w) {
            for (int64_t c = 0; c < s.in_c; ++c) out[c] = 0.0f;
          } else {
            const float* src = row + iw * s.in_c;
            for (int64_t c = 0; c < s.in_c; ++c) out[c] = src[c];
          }
        }
      }
    }
  }
}

// Adds in (oh, ow, kh, kw, c) order whichever path a row takes, so the sums
// are the same bits either way.
void Col2ImAdd(const Conv2DShape& s, const float* col, float* sample) {
  const int64_t patch = s.PatchSize();
  const int64_t row_floats = s.filter_w * s.in_c;
  for (int64_t oh = 0; oh < s.out_h; ++oh) {
    for (int64_t ow = 0; ow < s.out_w; ++ow) {
      const float* src = col + (oh * s.out_w + ow) * patch;
      const int64_t iw0 = ow * s.stride_w - s.pad_left;
      const bool contiguous = s.dilation_w == 1 && iw0 >= 0 && iw0 + s.filter_w <= s.in_w;
      for (int64_t kh = 0; kh < s.filter_h; ++kh, src += row_floats) {
        const int64_t ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
        if (ih < 0 || ih >= s.in_h) continue;
        float* row = sample + ih * s.in_w * s.in_c;
        if (contiguous) {
          float* dst = row + iw0 * s.in_c;
          for (int64_t i = 0; i < row_floats; ++i) dst[i] = dst[i] + src[i];
          continue;
        }
        for (int64_t kw = 0; kw < s.filter_w; ++kw) {
          const int64_t iw = iw0 + kw * s.dilation_w;
          if (iw < 0 || iw >= s.in_w) continue;
          float* dst = row + iw * s.in_c;
          const float* in = src + kw * s.in_c;
          for (int64_t c = 0; c < s.in_c; ++c) dst[c] = dst[c] + in[c];
        }
      }
    }
  }
}

namespace {

// A sample's im2col matrix: the sample itself for a 1x1, stride-1 convolution
// (already [pixels, channels]), else built in the lane's scratch.
const float* SampleColumns(const Conv2DShape& s, const float* sample, float* scratch) {
  if (s.IsPointwise()) return sample;
  Im2Col(s, sample, scratch);
  return scratch;
}

}  // namespace

void Conv2DForward(const Conv2DShape& s, const float* input, const float* filter,
                   float* output, int64_t num_lanes, float* workspace,
                   const CpuLanePool& pool) {
  const int64_t col_size = s.OutputPixels() * s.PatchSize();
  pool.Run(num_lanes, s.batch, [&](int lane, int64_t n) {
    const float* col = SampleColumns(s, input + n * s.InputSampleElements(),
                                     workspace + lane * col_size);
    GemmArgs g;
    g.m = s.OutputPixels();
    g.n = s.out_c;
    g.k = s.PatchSize();
    g.a = col;
    g.lda = s.PatchSize();
    g.b = filter;
    g.ldb = s.out_c;
    g.c = output + n * s.OutputSampleElements();
    g.ldc = s.out_c;
    Gemm(g);
  });
}

void Conv2DBackpropInput(const Conv2DShape& s, const float* filter,
                         const float* output_grad, float* input_grad,
                         int64_t num_lanes, float* workspace,
                         const CpuLanePool& pool) {
  const int64_t col_size = s.OutputPixels() * s.PatchSize();
  pool.Run(num_lanes, s.batch, [&](int lane, int64_t n) {
    float* sample_grad = input_grad + n * s.InputSampleElements();
    GemmArgs g;  // dcol = dy[n] * filter^T
    g.transpose_b = true;
    g.m = s.OutputPixels();
    g.n = s.PatchSize();
    g.k = s.out_c;
    g.a = output_grad + n * s.OutputSampleElements();
    g.lda = s.out_c;
    g.b = filter;
    g.ldb = s.out_c;
    g.ldc = s.PatchSize();
    if (s.IsPointwise()) {
      g.c = sample_grad;
      Gemm(g);
      return;
    }
    float* col = workspace + lane * col_size;
    g.c = col;
    Gemm(g);
    std::memset(sample_grad, 0, sizeof(float) * s.InputSampleElements());
    Col2ImAdd(s, col, sample_grad);
  });
}

void Conv2DBackpropFilter(const Conv2DShape& s, const float* input,
                          const float* output_grad, float* filter_grad,
                          int64_t num_lanes, float* workspace,
                          const CpuLanePool& pool) {
  const int64_t col_size = s.OutputPixels() * s.PatchSize();
  const int64_t groups = FilterGradGroups(s);
  float* cols = workspace;
  float* partials = groups > 1 ? workspace + Conv2DForwardWorkspace(s, num_lanes) : filter_grad;
  pool.Run(num_lanes, groups, [&](int lane, int64_t group) {
    float* partial = partials + group * s.FilterElements();
    const int64_t first = SplitPoint(s.batch, groups, group);
    const int64_t last = SplitPoint(s.batch, groups, group + 1);
    for (int64_t n = first; n < last; ++n) {
      const float* col = SampleColumns(s, input + n * s.InputSampleElements(),
                                       cols + lane * col_size);
      GemmArgs g;  // partial (+)= col^T * dy[n]
      g.transpose_a = true;
      g.m = s.PatchSize();
      g.n = s.out_c;
      g.k = s.OutputPixels();
      g.a = col;
      g.lda = s.PatchSize();
      g.b = output_grad + n * s.OutputSampleElements();
      g.ldb = s.out_c;
      g.c = partial;
      g.ldc = s.out_c;
      g.accumulate = n > first;
      Gemm(g);
    }
  });
  if (groups > 1) {
    SumPartialsInOrder(partials, groups, s.FilterElements(), filter_grad, num_lanes, pool);
  }
}

void ReferenceConv2D(const Conv2DShape& s, const float* input, const float* filter,
                     float* output) {
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t oh = 0; oh < s.out_h; ++oh) {
      for (int64_t ow = 0; ow < s.out_w; ++ow) {
        for (int64_t o = 0; o < s.out_c; ++o) {
          double acc = 0.0;
          for (int64_t kh = 0; kh < s.filter_h; ++kh) {
            const int64_t ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
            if (ih < 0 || ih >= s.in_h) continue;
            for (int64_t kw = 0; kw < s.filter_w; ++kw) {
              const int64_t iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
              if (iw < 0 || iw >= s.in_w) continue;
              for (int64_t c = 0; c < s.in_c; ++c) {
                acc += static_cast<double>(input[((n * s.in_h + ih) * s.in_w + iw) * s.in_c + c]) *
                       filter[((kh * s.filter_w + kw) * s.in_c + c) * s.out_c + o];
              }
            }
          }
          output[((n * s.out_h + oh) * s.out_w + ow) * s.out_c + o] = static_cast<float>(acc);
        }
      }
    }
  }
}

}  // namespace tf_glp::core
