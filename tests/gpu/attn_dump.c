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
    if (!f || fwrite(x, sizeof(float), n, f) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: attn_dump OUTDIR H K D SEED G (P N R..)..\n");
        return 2;
    }
    const char *dir = argv[1];
    int H = atoi(argv[2]), K = atoi(argv[3]), D = atoi(argv[4]), G = atoi(argv[6]), ai = 7;
    unsigned long long seed = strtoull(argv[5], NULL, 10);
    int *P = calloc((size_t)G + 1, sizeof(int)), *N = calloc((size_t)G + 1, sizeof(int));
    const int **R = calloc((size_t)G + 1, sizeof(int *));
    for (int g = 0; g < G; g++) {
        if (ai + 1 >= argc) {
            fprintf(stderr, "group %d: missing P N\n", g);
            return 2;
        }
        P[g] = atoi(argv[ai++]);
        N[g] = atoi(argv[ai++]);
        int *Rg = calloc((size_t)N[g] + 1, sizeof(int));
        for (int s = 0; s < N[g]; s++) {
            if (ai >= argc) {
                fprintf(stderr, "group %d: missing R\n", g);
                return 2;
            }
            Rg[s] = atoi(argv[ai++]);
        }
        R[g] = Rg;
    }
    ranges rg = make_ranges(G, P, N, R);
    int T = rg.T;
    eng_backend *gpu = NULL;
    if (backend_cuda_create(&gpu, 0)) gc_die(NULL, "backend_cuda_create");
    size_t nq = (size_t)T * H * D, nk = (size_t)T * K * D;
    float *q = gc_rand(nq, 2.0f, seed), *k = gc_rand(nk, 2.0f, seed + 1), *v = gc_rand(nk, 1.0f, seed + 2);
    float *dout = gc_rand(nq, 1.0f, seed + 3), *zero = calloc(nk, sizeof(float));
    void *gq = gc_act(gpu, q, nq), *gk = gc_act(gpu, k, nk), *gv = gc_act(gpu, v, nk), *gdo = gc_act(gpu, dout, nq);
    void *go = gpu->alloc(gpu, nq * 2), *gdq = gpu->alloc(gpu, nq * 2), *gdk = gc_act(gpu, zero, nk), *gdv = gc_act(gpu, zero, nk);
    float *gl = gpu->alloc(gpu, (size_t)T * H * 4);
    attn_ranges r = gc_dev_ranges(gpu, rg);
    gpu->attention_fwd(gpu, go, gl, gq, gk, gv, r, T, H, K, D);
    gpu->attention_bwd(gpu, gdq, gdk, gdv, gdo, gq, gk, gv, go, gl, r, T, T, H, K, D);
    float *o = gc_get_act(gpu, go, nq), *l = gc_get_f32(gpu, gl, (size_t)T * H), *dq = gc_get_act(gpu, gdq, nq);
    float *dk = gc_get_act(gpu, gdk, nk), *dv = gc_get_act(gpu, gdv, nk);
    put(dir, "q", q, nq);
    put(dir, "k", k, nk);
    put(dir, "v", v, nk);
    put(dir, "dout", dout, nq);
    put(dir, "out", o, nq);
    put(dir, "lse", l, (size_t)T * H);
    put(dir, "dq", dq, nq);
    put(dir, "dk", dk, nk);
    put(dir, "dv", dv, nk);
    printf("T=%d H=%d K=%d D=%d G=%d\n", T, H, K, D, G);
    gpu->destroy(gpu);
    return 0;
}
