// The linear layer's activations and their derivatives, in float: one definition shared by the
// forward pass (linear_act.cu) and the backward's d_pre kernel (linear_grad.cu). The formulas are
// the float64 reference's (opfacade/_backends/reference/linear.py), evaluated with full-precision
// libdevice calls (NVRTC builds without fast math). Which activation uses which is the linear
// contract's table (opfacade/contracts/linear_activations.py).
#pragma once

struct GeluTanh {
    // d/dx of 0.5 x (1 + tanh(k0 (x + k1 x^3))), cuBLASLt's GELU (its epilogue computes the
    // forward).
    // Past |x| = 10 the tanh is +-1 to far below f32's resolution (1 - t^2 < 1e-37), so the
    // derivative is evaluated at the clamped x: beyond |x| ~ 2^64, x * x is inf and the second
    // term would be 0 * inf = NaN.
    static __device__ __forceinline__ float derivative(float x) {
        const float k0 = 0.7978845608028654f, k1 = 0.044715f;
        x = fminf(fmaxf(x, -10.0f), 10.0f);
        const float x2 = x * x;
        const float t = tanhf(k0 * x * (1.0f + k1 * x2));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k0 * (1.0f + 3.0f * k1 * x2);
    }
};

struct GeluErf {
    // x * Phi(x), Phi the standard normal CDF: torch's default ("none") GELU.
    static __device__ __forceinline__ float value(float x) {
        return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    }
    // Phi(x) + x * phi(x).
    static __device__ __forceinline__ float derivative(float x) {
        const float cdf = 0.5f * (1.0f + erff(x * 0.7071067811865476f));
        return cdf + x * 0.3989422804014327f * expf(-0.5f * x * x);
    }
};

struct Silu {
    // x * sigmoid(x). For x far below zero expf(-x) is inf and the sigmoid 0: no NaN.
    static __device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
    static __device__ __forceinline__ float value(float x) { return x * sigmoid(x); }
    static __device__ __forceinline__ float derivative(float x) {
        const float s = sigmoid(x);
        return s + x * s * (1.0f - s);
    }
};
