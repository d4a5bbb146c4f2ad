// The int8 (VNNI) and float32 FMA peak of one core: 8 independent accumulator chains in
// registers, 2e8 iterations each. The ceiling the 4-bit kernel's multi-row cost is measured
// against (README, "4-bit targets").
//
//     g++ -O2 benchmarks/vnni_peak.cpp -o /tmp/vnni_peak && /tmp/vnni_peak
//     (two at once, one per core, for the whole CPU: (/tmp/vnni_peak & /tmp/vnni_peak & wait))
#include <immintrin.h>
#include <chrono>
#include <cstdio>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
int run(long iters){
  __m512i a0=_mm512_set1_epi32(0),a1=_mm512_set1_epi32(1),a2=_mm512_set1_epi32(2),a3=_mm512_set1_epi32(3),a4=_mm512_set1_epi32(4),a5=_mm512_set1_epi32(5),a6=_mm512_set1_epi32(6),a7=_mm512_set1_epi32(7);
  __m512i w=_mm512_set1_epi8(3), x=_mm512_set1_epi8(5);
  for(long t=0;t<iters;t++){
    a0=_mm512_dpbusd_epi32(a0,w,x);a1=_mm512_dpbusd_epi32(a1,w,x);a2=_mm512_dpbusd_epi32(a2,w,x);a3=_mm512_dpbusd_epi32(a3,w,x);
    a4=_mm512_dpbusd_epi32(a4,w,x);a5=_mm512_dpbusd_epi32(a5,w,x);a6=_mm512_dpbusd_epi32(a6,w,x);a7=_mm512_dpbusd_epi32(a7,w,x);
    asm volatile("" : "+v"(w));
  }
  __m512i s=_mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0,a1),_mm512_add_epi32(a2,a3)),_mm512_add_epi32(_mm512_add_epi32(a4,a5),_mm512_add_epi32(a6,a7)));
  return _mm512_reduce_add_epi32(s);
}
__attribute__((target("avx512f")))
float runf(long iters){
  __m512 a0=_mm512_set1_ps(0),a1=_mm512_set1_ps(1),a2=_mm512_set1_ps(2),a3=_mm512_set1_ps(3),a4=_mm512_set1_ps(4),a5=_mm512_set1_ps(5),a6=_mm512_set1_ps(6),a7=_mm512_set1_ps(7);
  __m512 w=_mm512_set1_ps(0.99f), x=_mm512_set1_ps(0.01f);
  for(long t=0;t<iters;t++){
    a0=_mm512_fmadd_ps(a0,w,x);a1=_mm512_fmadd_ps(a1,w,x);a2=_mm512_fmadd_ps(a2,w,x);a3=_mm512_fmadd_ps(a3,w,x);
    a4=_mm512_fmadd_ps(a4,w,x);a5=_mm512_fmadd_ps(a5,w,x);a6=_mm512_fmadd_ps(a6,w,x);a7=_mm512_fmadd_ps(a7,w,x);
    asm volatile("" : "+v"(w));
  }
  __m512 s=_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0,a1),_mm512_add_ps(a2,a3)),_mm512_add_ps(_mm512_add_ps(a4,a5),_mm512_add_ps(a6,a7)));
  return _mm512_reduce_add_ps(s);
}
int main(){
  long it=200000000;
  for (int rep=0; rep<2; rep++){
  auto t=std::chrono::steady_clock::now();
  int s=run(it);
  double dt=std::chrono::duration<double>(std::chrono::steady_clock::now()-t).count();
  printf("%d zmm dpbusd/ns: %.2f  GMAC/s %.1f\n", s, it*8/dt/1e9, it*8*64/dt/1e9);
  t=std::chrono::steady_clock::now();
  float f=runf(it);
  dt=std::chrono::duration<double>(std::chrono::steady_clock::now()-t).count();
  printf("%f zmm fma/ns: %.2f  GFLOP/s %.1f\n", f, it*8/dt/1e9, it*8*32/dt/1e9);
  }
}
