// ringcoll local reduction: dst = dst (op) s[0] (op) s[1] ... in that order, and, when out is
// not null, out = the same result (the fused reduce-and-copy of a ring step, as NCCL's
// recvReduceCopySend).
//
// Words (as in kernels/_lowering.py): a *kind* is the element type a kernel works on. Half kinds
// (f16, bf16) are stored as 16-bit words, computed in float and rounded back after every step, so
// the n-ary result is bit-identical to torch's sequence of in-place ops. Signed sum/product run on
// the unsigned kind (wrap-around without undefined behaviour); bool and bitwise ops run on words.
//
// One thread handles one *pack* of 16 bytes (VEC elements) per grid-stride iteration when every
// pointer is 16 bytes past a 16-byte boundary by the same amount (VEC = 16 / sizeof(element)): the
// first `head` elements (fewer than VEC, bringing every pointer to a boundary) and the elements
// after the last whole pack are done one at a time by the same threads. When the pointers'
// misalignments differ, VEC = 1 and head = 0. (_lowering.pack_split computes head.)
//
// Self-contained on purpose: NVRTC inside a pip-installed CuPy may not find the toolkit's
// cuda_fp16.h / cuda_bf16.h, so half conversions use PTX cvt (f16) and bit arithmetic (bf16).

namespace ringcoll {

typedef unsigned long long u64_t;

// ---- kinds: storage type S, arithmetic type A, conversions up (S -> A) and down (A -> S) ----

#define RINGCOLL_PLAIN_KIND(NAME, STORAGE, ARITH)                                              \
  struct NAME {                                                                                \
    typedef STORAGE S;                                                                         \
    typedef ARITH A;                                                                           \
    static __device__ __forceinline__ A up(S s) { return static_cast<A>(s); }                  \
    static __device__ __forceinline__ S down(A a) { return static_cast<S>(a); }                \
  };

RINGCOLL_PLAIN_KIND(f32, float, float)
RINGCOLL_PLAIN_KIND(f64, double, double)
// Narrow unsigned kinds compute in unsigned int: u16 * u16 promoted to (signed) int could overflow.
RINGCOLL_PLAIN_KIND(u8, unsigned char, unsigned int)
RINGCOLL_PLAIN_KIND(u16, unsigned short, unsigned int)
RINGCOLL_PLAIN_KIND(u32, unsigned int, unsigned int)
RINGCOLL_PLAIN_KIND(u64, u64_t, u64_t)
// Signed kinds only ever see min and max.
RINGCOLL_PLAIN_KIND(i8, signed char, int)
RINGCOLL_PLAIN_KIND(i16, short, int)
RINGCOLL_PLAIN_KIND(i32, int, int)
RINGCOLL_PLAIN_KIND(i64, long long, long long)
#undef RINGCOLL_PLAIN_KIND

struct f16 {
  typedef unsigned short S;
  typedef float A;
  static __device__ __forceinline__ A up(S s) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
    return f;
  }
  static __device__ __forceinline__ S down(A a) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(a));
    return h;
  }
};

struct bf16 {
  typedef unsigned short S;
  typedef float A;
  static __device__ __forceinline__ A up(S s) {
    return __uint_as_float(static_cast<unsigned>(s) << 16);
  }
  // Round to nearest even, NaN -> 0x7fc0: the same bits as torch's c10::BFloat16.
  static __device__ __forceinline__ S down(A a) {
    unsigned u = __float_as_uint(a);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return static_cast<S>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};

// ---- operators, numbered as LOCAL_OPS / _lowering.OP_CODE ----

enum { SUM = 0, PRODUCT = 1, MIN = 2, MAX = 3, BAND = 4, BOR = 5, BXOR = 6 };

template <int OP, class A>
__device__ __forceinline__ A apply(A a, A x) {
  // min/max propagate NaN like torch.minimum/maximum; for integers (a != a) is always false.
  if constexpr (OP == SUM) return a + x;
  else if constexpr (OP == PRODUCT) return a * x;
  else if constexpr (OP == MIN) return (a != a) ? a : ((x != x || x < a) ? x : a);
  else if constexpr (OP == MAX) return (a != a) ? a : ((x != x || x > a) ? x : a);
  else if constexpr (OP == BAND) return a & x;
  else if constexpr (OP == BOR) return a | x;
  else return a ^ x;
}

// ---- packs: VEC elements moved as one 16-byte load/store (or one element when VEC == 1) ----

template <class S, int VEC>
union Pack {
  static_assert(sizeof(S) * VEC == 16, "a pack is 16 bytes");
  uint4 raw;
  S v[VEC];
  static __device__ __forceinline__ Pack load(const S* p, u64_t i) {
    Pack r;
    r.raw = reinterpret_cast<const uint4*>(p)[i];
    return r;
  }
  static __device__ __forceinline__ void store(S* p, u64_t i, const Pack& r) {
    reinterpret_cast<uint4*>(p)[i] = r.raw;
  }
};

template <class S>
union Pack<S, 1> {
  S raw;
  S v[1];
  static __device__ __forceinline__ Pack load(const S* p, u64_t i) {
    Pack r;
    r.raw = p[i];
    return r;
  }
  static __device__ __forceinline__ void store(S* p, u64_t i, const Pack& r) { p[i] = r.raw; }
};

template <class K, int OP>
__device__ __forceinline__ typename K::A step(typename K::A a, typename K::S x) {
  return K::up(K::down(apply<OP>(a, K::up(x))));
}

template <class K, int OP, int NSRC>
__device__ __forceinline__ void reduce_one(typename K::S* dst, typename K::S* out,
                                           const typename K::S* const* src, u64_t i) {
  typename K::A a = K::up(dst[i]);
#pragma unroll
  for (int j = 0; j < NSRC; ++j) a = step<K, OP>(a, src[j][i]);
  dst[i] = K::down(a);
  if (out) out[i] = dst[i];
}

template <class K, int OP, int VEC, int NSRC>
__device__ __forceinline__ void reduce_packs(typename K::S* dst, typename K::S* out,
                                             const typename K::S* const* src, u64_t n,
                                             u64_t head) {
  typedef typename K::S S;
  typedef Pack<S, VEC> P;
  const u64_t stride = static_cast<u64_t>(gridDim.x) * blockDim.x;
  const u64_t first = static_cast<u64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (VEC > 1) {
    if (head > n) head = n;
    for (u64_t i = first; i < head; i += stride) reduce_one<K, OP, NSRC>(dst, out, src, i);
  } else {
    head = 0;
  }
  // The packs start `head` elements in, where every pointer is 16-byte aligned.
  S* const body = dst + head;
  S* const body_out = out ? out + head : out;
  const S* body_src[NSRC];
#pragma unroll
  for (int j = 0; j < NSRC; ++j) body_src[j] = src[j] + head;
  const u64_t npacks = (n - head) / VEC;
  for (u64_t p = first; p < npacks; p += stride) {
    // Every load of the iteration is issued before any arithmetic.
    P d = P::load(body, p);
    P s[NSRC];
#pragma unroll
    for (int j = 0; j < NSRC; ++j) s[j] = P::load(body_src[j], p);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      typename K::A a = K::up(d.v[k]);
#pragma unroll
      for (int j = 0; j < NSRC; ++j) a = step<K, OP>(a, s[j].v[k]);
      d.v[k] = K::down(a);
    }
    P::store(body, p, d);
    if (out) P::store(body_out, p, d);
  }
  if (VEC > 1) {
    for (u64_t i = head + npacks * VEC + first; i < n; i += stride)
      reduce_one<K, OP, NSRC>(dst, out, src, i);
  }
}

// NSRC (1..8) is a compile-time parameter: one instantiation per source count, compiled only
// for the counts a process uses (kernels/_cupy.py compiles one module per kind and count, on
// first use). Each instantiation holds one body, sized for exactly its sources: a runtime
// switch over eight bodies made every instantiation pay the registers of the 8-source body (f32
// packs: 44 registers per thread for a 1-source reduction). The pointers past NSRC are never read
// (the dispatch passes null).
template <class K, int OP, int VEC, int NSRC>
__global__ void __launch_bounds__(256)
reduce_kernel(typename K::S* dst, typename K::S* out,
              const typename K::S* s0, const typename K::S* s1, const typename K::S* s2,
              const typename K::S* s3, const typename K::S* s4, const typename K::S* s5,
              const typename K::S* s6, const typename K::S* s7, u64_t n, u64_t head) {
  static_assert(NSRC >= 1 && NSRC <= 8, "one kernel pass reduces 1 to 8 sources");
  const typename K::S* const all[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
  const typename K::S* src[NSRC];
#pragma unroll
  for (int j = 0; j < NSRC; ++j) src[j] = all[j];
  reduce_packs<K, OP, VEC, NSRC>(dst, out, src, n, head);
}

}  // namespace ringcoll
