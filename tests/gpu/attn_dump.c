/* attn_dump.c — runs the CUDA backend's packed shared-prefix attention forward and backward on
 * random bf16 inputs and writes everything as raw float32 for tests/gpu/attn_vs_sdpa.py, which
 * checks it against PyTorch SDPA on the unpacked N(P+R) layout.
 * Usage: attn_dump OUTDIR H K D SEED G  P_1 N_1 R_1,1 .. R_1,N  ..  P_G N_G R_G,1 .. R_G,N
 * Writes OUTDIR/{q,k,v,dout,out,lse,dq,dk,dv}.f32 (q/out/dq/dout: T x H x D; k/v/dk/dv:
 * T x K x D; lse: T x H). dk and dv start at zero. Exit status 0 when every call succeeded. */
#include "tests/gpu/gpu_check.h"

static void put(const char *dir, const char *name, const float *x, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.f32", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(x, sizeof(float), n, f) != n) { fprintf(stderr, "cannot write %s\n", path); exit(1); }
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc < 7) { fprintf(stderr, "usage: attn_dump OUTDIR H K D SEED G (P N R..)..\n"); return 2; }
    const char *dir = argv[1];
    int H = atoi(argv[2]), K = atoi(argv[3]), D = atoi(argv[4]), G = atoi(argv[6]), ai = 7, T = 0;
    unsigned long long seed = strtoull(argv[5], NULL, 10);
    int *a0 = NULL, *a1 = NULL, *b0 = NULL, *b1 = NULL;
    for (int g = 0; g < G; g++) {
        if (ai + 1 >= argc) { fprintf(stderr, "group %d: missing P N\n", g); return 2; }
        int P = atoi(argv[ai++]), N = atoi(argv[ai++]), p0 = T;
        a0 = realloc(a0, (T + P) * sizeof(int)); a1 = realloc(a1, (T + P) * sizeof(int));
        b0 = realloc(b0, (T + P) * sizeof(int)); b1 = realloc(b1, (T + P) * sizeof(int));
        for (int i = 0; i < P; i++, T++) { a0[T] = p0; a1[T] = p0 + i + 1; b0[T] = b1[T] = 0; }
        for (int s = 0; s < N; s++) {
            if (ai >= argc) { fprintf(stderr, "group %d: missing R\n", g); return 2; }
            int R = atoi(argv[ai++]), s0 = T;
            a0 = realloc(a0, (T + R) * sizeof(int)); a1 = realloc(a1, (T + R) * sizeof(int));
            b0 = realloc(b0, (T + R) * sizeof(int)); b1 = realloc(b1, (T + R) * sizeof(int));
            for (int j = 0; j < R; j++, T++) { a0[T] = p0; a1[T] = p0 + P; b0[T] = s0; b1[T] = s0 + j + 1; }
        }
    }
    eng_backend *gpu = NULL;
    if (backend_cuda_create(&gpu, 0)) gc_die(NULL, "backend_cuda_create");
    size_t nq = (size_t)T * H * D, nk = (size_t)T * K * D;
    float *q = gc_rand(nq, 2.0f, seed), *k = gc_rand(nk, 2.0f, seed + 1), *v = gc_rand(nk, 1.0f, seed + 2);
    float *dout = gc_rand(nq, 1.0f, seed + 3), *zero = calloc(nk, sizeof(float));
    void *gq = gc_act(gpu, q, nq), *gk = gc_act(gpu, k, nk), *gv = gc_act(gpu, v, nk), *gdo = gc_act(gpu, dout, nq);
    void *go = gpu->alloc(gpu, nq * 2), *gdq = gpu->alloc(gpu, nq * 2), *gdk = gc_act(gpu, zero, nk), *gdv = gc_act(gpu, zero, nk);
    float *gl = gpu->alloc(gpu, (size_t)T * H * 4);
    attn_ranges r = { gc_dev(gpu, a0, (size_t)T * 4), gc_dev(gpu, a1, (size_t)T * 4), gc_dev(gpu, b0, (size_t)T * 4),
                      gc_dev(gpu, b1, (size_t)T * 4) };
    gpu->attention_fwd(gpu, go, gl, gq, gk, gv, r, T, H, K, D);
    gpu->attention_bwd(gpu, gdq, gdk, gdv, gdo, gq, gk, gv, go, gl, r, T, H, K, D);
    float *o = gc_get_act(gpu, go, nq), *l = gc_get_f32(gpu, gl, (size_t)T * H), *dq = gc_get_act(gpu, gdq, nq);
    float *dk = gc_get_act(gpu, gdk, nk), *dv = gc_get_act(gpu, gdv, nk);
    put(dir, "q", q, nq); put(dir, "k", k, nk); put(dir, "v", v, nk); put(dir, "dout", dout, nq);
    put(dir, "out", o, nq); put(dir, "lse", l, (size_t)T * H); put(dir, "dq", dq, nq); put(dir, "dk", dk, nk);
    put(dir, "dv", dv, nk);
    printf("T=%d H=%d K=%d D=%d G=%d\n", T, H, K, D, G);
    gpu->destroy(gpu);
    return 0;
}
