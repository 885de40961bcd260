// Shared by opfacade's NVRTC kernels: raw pointers only, no framework or CUDA headers (NVRTC
// programs here include nothing but these files), so every kernel compiles anywhere NVRTC runs.
#pragma once

typedef long long i64;
typedef unsigned short u16;

// Programmatic dependent launch (sm_90 and newer; launch.py's PackedLaunch(overlap_previous)). A
// kernel launched so may start while the stream's previous kernel still runs: it must wait for
// that grid (griddepcontrol.wait: complete, its writes visible) before it reads or writes memory
// the previous kernel may touch. let_dependents_launch lets the stream's next kernel, if it was
// launched so, start before this one ends (it waits for this grid in turn). Both are no-ops in a
// kernel launched plainly.
__device__ __forceinline__ void let_dependents_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The first statement of a kernel that may launch as a programmatic dependent: it waits for the
// previous grid before anything else, then lets the next launch. In that order a dependent that
// reads before its own wait (decode's merge reads seq_lens) still reads after the previous grid.
__device__ __forceinline__ void follow_previous_grid() {
    wait_for_prerequisite_grid();
    let_dependents_launch();
}

// Half-precision storage types as plain 16-bit payloads; arithmetic happens in float.
struct f16_t { u16 bits; };
struct bf16_t { u16 bits; };

// Math<T>: the type arithmetic on T is done in, and the two conversions at the edges.
template <typename T> struct Math;

template <> struct Math<double> {
    typedef double compute;
    static __device__ __forceinline__ double up(double x) { return x; }
    static __device__ __forceinline__ double down(double x) { return x; }
};

template <> struct Math<float> {
    typedef float compute;
    static __device__ __forceinline__ float up(float x) { return x; }
    static __device__ __forceinline__ float down(float x) { return x; }
};

template <> struct Math<f16_t> {
    typedef float compute;
    static __device__ __forceinline__ float up(f16_t x) {
        float r;
        asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x.bits));
        return r;
    }
    static __device__ __forceinline__ f16_t down(float x) {
        f16_t r;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
        return r;
    }
};

template <> struct Math<bf16_t> {
    typedef float compute;
    static __device__ __forceinline__ float up(bf16_t x) {
        return __uint_as_float(((unsigned)x.bits) << 16);
    }
    static __device__ __forceinline__ bf16_t down(float x) {
        bf16_t r;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));  // sm_80+
        return r;
    }
};

// Sixteen bytes of T: the widest single load or store a thread can issue.
template <typename T> struct alignas(16) Pack {
    static constexpr int N = 16 / sizeof(T);
    T v[N];
};

// Loads the pack starting at column j0 of a row of `len` elements. The vector path needs the row
// 16-byte aligned (checked on the host); the tail and unaligned rows go element by element and
// fill missing columns with zeros. Either way, element n of the pack is column j0 + n, so code
// that reduces over packs sums in the same order whichever path loaded them.
// Streamed data is touched once: with OPFACADE_STREAMING the 16-byte loads carry the last-use
// (.lu) hint and the stores the evict-first (.cs) one, so they do not push reusable lines out
// of L2. Cache operators are hints (PTX ISA: they do not change memory consistency), so no
// value depends on them. On an H200 the decode step read up to 10 points of a device copy
// faster with .lu loads than with .cs (q_len 4 73.5% -> 81.9%, B256 S1024 pages 16 91.0% ->
// 93.4%, B1 S32768 75.2% -> 76.9%; B64 S4096 unchanged at 97.7%, f32 at 101%;
// scripts/decode_variants.py --lu, record catalog/probes/decode_last_use_H200.json). SASS:
// LDG.E.LU against LDG.E.EF. No H100 has run it. After torch's flash or cuDNN attention kernels
// every hint gains less, last-use the least less of those tried (a state those kernels leave:
// docs/DECODE.md, "What the torch peer leaves behind").
// The streamed loads' instruction: last-use, or for the probes another hint
// (scripts/decode_variants.py --lu; scripts/decode_b1_neighbours_probe.py --hints, which also
// builds OPFACADE_STREAMING_POLICY_EVICT_FIRST below).
#if defined(OPFACADE_STREAMING_EVICT_FIRST)
#define OPFACADE_LOAD16 "ld.global.cs.v4.u32"
#elif defined(OPFACADE_STREAMING_LU_L2_256)
#define OPFACADE_LOAD16 "ld.global.lu.L2::256B.v4.u32"
#elif defined(OPFACADE_STREAMING_NO_ALLOCATE)
#define OPFACADE_LOAD16 "ld.global.L1::no_allocate.v4.u32"
#else
#define OPFACADE_LOAD16 "ld.global.lu.v4.u32"
#endif

__device__ __forceinline__ uint4 load16(const void* p) {
#if OPFACADE_STREAMING
    uint4 v;
#ifdef OPFACADE_STREAMING_POLICY_EVICT_FIRST  // an L2 evict-first policy, for the probe
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
#else
    asm volatile(OPFACADE_LOAD16 " {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif
    return v;
#else
    return *reinterpret_cast<const uint4*>(p);
#endif
}

__device__ __forceinline__ void store16(void* p, uint4 v) {
#if OPFACADE_STREAMING
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
#else
    *reinterpret_cast<uint4*>(p) = v;
#endif
}

// store16 where `write` holds, as one predicated store (p need not be valid where it does not),
// so that a kernel whose last act is the store has its tests feed `write` instead of returning
// early at each (kv_append.cu: one straight run of code from its loads to its store).
__device__ __forceinline__ void store16_where(void* p, uint4 v, bool write) {
#if OPFACADE_STREAMING
#define OPFACADE_STORE16_WHERE "st.global.cs.v4.u32"  // evict-first, as store16
#else
#define OPFACADE_STORE16_WHERE "st.global.v4.u32"
#endif
    asm volatile("{\n\t.reg .pred w;\n\tsetp.ne.b32 w, %5, 0;\n\t"
                 "@w " OPFACADE_STORE16_WHERE " [%0], {%1, %2, %3, %4};\n\t}"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"((int)write) : "memory");
#undef OPFACADE_STORE16_WHERE
}

template <typename T>
__device__ __forceinline__ void load_pack(Pack<T>& out, const T* row, int j0, int len, bool vec) {
    if (vec && j0 + Pack<T>::N <= len) {
        *reinterpret_cast<uint4*>(out.v) = load16(row + j0);
    } else {
#pragma unroll
        for (int n = 0; n < Pack<T>::N; ++n) {
            if (j0 + n < len) out.v[n] = row[j0 + n];
            else out.v[n] = T();
        }
    }
}

template <typename T>
__device__ __forceinline__ void store_pack(const Pack<T>& in, T* row, int j0, int len, bool vec) {
    if (vec && j0 + Pack<T>::N <= len) {
        store16(row + j0, *reinterpret_cast<const uint4*>(in.v));
    } else {
#pragma unroll
        for (int n = 0; n < Pack<T>::N; ++n) {
            if (j0 + n < len) row[j0 + n] = in.v[n];
        }
    }
}

// A warp's lanes walking a row together: lane l loads packs p0, p0 + 32, ... (U of them, those
// below `packs`), so each load instruction of the warp covers 512 contiguous bytes.
template <int U, typename T>
__device__ __forceinline__ void load_lane_packs(Pack<T> (&buf)[U], const T* row, int p0,
                                                int packs, int len, bool vec) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int p = p0 + 32 * u;
        if (p < packs) load_pack(buf[u], row, p * Pack<T>::N, len, vec);
    }
}

// Sum over a warp in a fixed butterfly order: the same bits every run.
template <typename A>
__device__ __forceinline__ A warp_sum(A x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Sum over a block of up to 32 warps: warp sums, then warp 0 adds them in warp order.
// `scratch` holds one A per warp. The result is valid in thread 0 only.
template <typename A>
__device__ __forceinline__ A block_sum(A x, A* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    x = warp_sum(x);
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    A total = A(0);
    if (threadIdx.x == 0) {
        for (int w = 0; w < warps; ++w) total += scratch[w];
    }
    return total;
}
