// How fast one core issues `vpmaddwd` (AVX2): alone, with the `vpaddd` each needs, and in the
// shape of gguf_int_linear.cpp's widened inner loop (x's 16-bit pair broadcast from memory, two
// multiply-adds over widened quants read from L1, their adds; four rows of a tile); and, for
// scale, float32 `vfmadd231ps` alone. Each line also says how many multiply-adds a second that
// is (16 per `vpmaddwd`, 8 per float32 FMA). The figures in docs/benchmarks.md ("Quantized
// weights") come from it:
//
//     gcc -O3 -march=native scripts/int16_microbench.c -o /tmp/int16_microbench && /tmp/int16_microbench
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// One line: `instructions` of `products` multiply-adds each in `seconds`.
static void report(const char* loop, double instructions, int products, double seconds) {
  printf("%-24s %.2f G/s (%.1f G multiply-adds/s)\n", loop, instructions / seconds / 1e9,
         instructions * products / seconds / 1e9);
}

enum { kBlocks = 32 };  // 16 KiB of widened quants: L1
static __m256i W[kBlocks * 16];
static int16_t X[4][kBlocks * 32];

int main(void) {
  const long n = 100000000;
  __m256i a = _mm256_set1_epi16(3), b = _mm256_set1_epi16(5);
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  double t = now();
  for (long i = 0; i < n; i++) {  // 8 independent vpmaddwd a pass
    __asm__ volatile(
        "vpmaddwd %6,%7,%%ymm15\n\tvpmaddwd %6,%7,%%ymm14\n\tvpmaddwd %6,%7,%%ymm13\n\t"
        "vpmaddwd %6,%7,%%ymm12\n\tvpmaddwd %6,%7,%%ymm11\n\tvpmaddwd %6,%7,%%ymm10\n\t"
        "vpmaddwd %6,%7,%%ymm15\n\tvpmaddwd %6,%7,%%ymm14\n\t"
        : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5)
        : "x"(a), "x"(b)
        : "ymm10", "ymm11", "ymm12", "ymm13", "ymm14", "ymm15");
  }
  report("vpmaddwd alone:", n * 8.0, 16, now() - t);
  t = now();
  for (long i = 0; i < n; i++) {  // each product added into one of 6 accumulators
    __asm__ volatile(
        "vpmaddwd %6,%7,%%ymm15\n\tvpaddd %%ymm15,%0,%0\n\t"
        "vpmaddwd %6,%7,%%ymm14\n\tvpaddd %%ymm14,%1,%1\n\t"
        "vpmaddwd %6,%7,%%ymm13\n\tvpaddd %%ymm13,%2,%2\n\t"
        "vpmaddwd %6,%7,%%ymm12\n\tvpaddd %%ymm12,%3,%3\n\t"
        "vpmaddwd %6,%7,%%ymm11\n\tvpaddd %%ymm11,%4,%4\n\t"
        "vpmaddwd %6,%7,%%ymm10\n\tvpaddd %%ymm10,%5,%5\n\t"
        "vpmaddwd %6,%7,%%ymm15\n\tvpaddd %%ymm15,%0,%0\n\t"
        "vpmaddwd %6,%7,%%ymm14\n\tvpaddd %%ymm14,%1,%1\n\t"
        : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5)
        : "x"(a), "x"(b)
        : "ymm10", "ymm11", "ymm12", "ymm13", "ymm14", "ymm15");
  }
  report("vpmaddwd + vpaddd:", n * 8.0, 16, now() - t);

  __m256 fa = _mm256_set1_ps(1.0f), fb = _mm256_set1_ps(1e-9f), f0 = _mm256_setzero_ps();
  __m256 f1 = f0, f2 = f0, f3 = f0, f4 = f0, f5 = f0, f6 = f0, f7 = f0;
  t = now();
  for (long i = 0; i < n; i++) {  // 8 independent chains: two FMAs a cycle need 8 in flight
    __asm__ volatile(
        "vfmadd231ps %8,%9,%0\n\tvfmadd231ps %8,%9,%1\n\tvfmadd231ps %8,%9,%2\n\t"
        "vfmadd231ps %8,%9,%3\n\tvfmadd231ps %8,%9,%4\n\tvfmadd231ps %8,%9,%5\n\t"
        "vfmadd231ps %8,%9,%6\n\tvfmadd231ps %8,%9,%7\n\t"
        : "+x"(f0), "+x"(f1), "+x"(f2), "+x"(f3), "+x"(f4), "+x"(f5), "+x"(f6), "+x"(f7)
        : "x"(fa), "x"(fb));
  }
  report("float32 FMA alone:", n * 8.0, 8, now() - t);

  for (int i = 0; i < kBlocks * 16; i++) W[i] = _mm256_set1_epi16((short)(i & 7));
  for (int r = 0; r < 4; r++)
    for (int i = 0; i < kBlocks * 32; i++) X[r][i] = (int16_t)((i * 7 + r) & 15);
  const long reps = 400000;
  __m256i total = _mm256_setzero_si256();
  t = now();
  for (long it = 0; it < reps; it++) {
    for (int blk = 0; blk < kBlocks; blk++) {
      const __m256i* v = W + blk * 16;
      for (int r = 0; r < 4; r++) {
        const int16_t* xb = X[r] + blk * 32;
        __m256i l = _mm256_setzero_si256(), h = l;
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
          int32_t pair;
          __builtin_memcpy(&pair, xb + (s % 2 ? 16 : 0) + 4 * (s / 2), 4);
          const __m256i x4 = _mm256_set1_epi32(pair);
          l = _mm256_add_epi32(l, _mm256_madd_epi16(_mm256_load_si256(v + 2 * s), x4));
          h = _mm256_add_epi32(h, _mm256_madd_epi16(_mm256_load_si256(v + 2 * s + 1), x4));
          __asm__("" : "+x"(l), "+x"(h));  // as the kernel: each step's sum in its register
        }
        total = _mm256_add_epi32(total, _mm256_hadd_epi32(l, h));
      }
    }
  }
  report("the kernel's inner loop:", (double)reps * kBlocks * 4 * 16, 16, now() - t);
  int out[8];
  _mm256_storeu_si256((__m256i*)out, total);
  printf("(checksum %d: the sums are used)\n", out[0]);
  return 0;
}
