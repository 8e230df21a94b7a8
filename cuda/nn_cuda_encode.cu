/* The maker's pipelined forward pass on the GPU (see nn_cuda_encode.h). */
#include "nn_cuda_encode.h"
#include "nn_cuda.h"
#include "nn_cuda_internal.h"

#include <string.h>

#define ENC_SLOTS 2

/* x (N) = pixels / 255 */
__global__ static void s_u8_to_float(float *x, const uint8_t *px, long long N)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < N; i += (long long)gridDim.x * blockDim.x) {
        x[i] = (float)px[i] * (1.0f / 255.0f);
    }
}

/* out (M, OC) += bias per column, then ReLU when relu. */
__global__ static void s_bias_act(float *out, const float *bias, long long N, int OC, int relu)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < N; i += (long long)gridDim.x * blockDim.x) {
        float v = out[i] + bias[i % OC];
        out[i] = relu ? fmaxf(v, 0.0f) : v;
    }
}

/* probs (M, C) = softmax of logits per row; one thread per row (C is a class count, small). */
__global__ static void s_softmax_rows(float *probs, const float *logits, int M, int C)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= M) {
        return;
    }
    const float *z = logits + (size_t)r * C;
    float mx = z[0];
    for (int c = 1; c < C; c++) {
        mx = fmaxf(mx, z[c]);
    }
    float s = 0.0f;
    for (int c = 0; c < C; c++) {
        s += expf(z[c] - mx);
    }
    for (int c = 0; c < C; c++) {
        probs[(size_t)r * C + c] = expf(z[c] - mx) / s;
    }
}

typedef struct {
    cudaStream_t stream;
    uint8_t *h_px;     /* pinned (chunk, in0) */
    float *h_emb;      /* pinned (chunk, E) */
    float *h_probs;    /* pinned (chunk, C) or NULL */
    uint8_t *d_px;     /* (chunk, in0) */
    float *d_act[2];   /* (chunk, maxw) ping-pong */
    float *d_probs;    /* (chunk, C) or NULL */
    int off, rows;     /* the chunk in flight in this slot (rows 0: none) */
} s_slot_t;

static cublasHandle_t s_handle = NULL; /* this module's own handle: its stream is switched per slot */

/* Copies a finished slot's results out of pinned memory into the caller's arrays. */
static void s_drain(s_slot_t *s, int E, int C, float *emb, float *probs)
{
    if (s->rows == 0) {
        return;
    }
    NN_CUDA_CHECK(cudaStreamSynchronize(s->stream));
    if (emb) {
        memcpy(emb + (size_t)s->off * E, s->h_emb, sizeof(float) * (size_t)s->rows * E);
    }
    if (probs) {
        memcpy(probs + (size_t)s->off * C, s->h_probs, sizeof(float) * (size_t)s->rows * C);
    }
    s->rows = 0;
}

extern "C" void nn_encode_u8_cuda(const float *const *w, const float *const *b, const int *in, const int *out,
                                  int n_layers, int n_hidden, const uint8_t *pixels, int n, float *emb, float *probs,
                                  int chunk)
{
    if (n <= 0) {
        return;
    }
    nn_cuda_init();
    if (!s_handle) {
        NN_CUBLAS_CHECK(cublasCreate(&s_handle));
        NN_CUBLAS_CHECK(cublasSetMathMode(s_handle, CUBLAS_DEFAULT_MATH)); /* FP32, as the CPU reference */
    }
    const int in0 = in[0], E = out[n_hidden - 1];
    const bool want_probs = probs && n_layers > n_hidden;
    const int C = want_probs ? out[n_layers - 1] : 0;
    const int last = want_probs ? n_layers : n_hidden; /* layers to run */
    int maxw = in0;
    for (int l = 0; l < n_layers; l++) {
        maxw = out[l] > maxw ? out[l] : maxw;
    }
    if (chunk > n) {
        chunk = n;
    }
    s_slot_t slot[ENC_SLOTS];
    memset(slot, 0, sizeof slot);
    for (int s = 0; s < ENC_SLOTS; s++) {
        NN_CUDA_CHECK(cudaStreamCreateWithFlags(&slot[s].stream, cudaStreamNonBlocking));
        NN_CUDA_CHECK(cudaMallocHost((void **)&slot[s].h_px, (size_t)chunk * in0));
        NN_CUDA_CHECK(cudaMallocHost((void **)&slot[s].h_emb, sizeof(float) * (size_t)chunk * E));
        NN_CUDA_CHECK(cudaMalloc((void **)&slot[s].d_px, (size_t)chunk * in0));
        NN_CUDA_CHECK(cudaMalloc((void **)&slot[s].d_act[0], sizeof(float) * (size_t)chunk * maxw));
        NN_CUDA_CHECK(cudaMalloc((void **)&slot[s].d_act[1], sizeof(float) * (size_t)chunk * maxw));
        if (C) {
            NN_CUDA_CHECK(cudaMallocHost((void **)&slot[s].h_probs, sizeof(float) * (size_t)chunk * C));
            NN_CUDA_CHECK(cudaMalloc((void **)&slot[s].d_probs, sizeof(float) * (size_t)chunk * C));
        }
    }
    const float one = 1.0f, zero = 0.0f;
    int next = 0;
    for (int off = 0; off < n; off += chunk, next = (next + 1) % ENC_SLOTS) {
        s_slot_t *s = &slot[next];
        s_drain(s, E, C, emb, probs); /* the slot's previous chunk must be out before its buffers are reused */
        const int m = n - off < chunk ? n - off : chunk;
        s->off = off;
        s->rows = m;
        memcpy(s->h_px, pixels + (size_t)off * in0, (size_t)m * in0);
        NN_CUDA_CHECK(cudaMemcpyAsync(s->d_px, s->h_px, (size_t)m * in0, cudaMemcpyHostToDevice, s->stream));
        long long nx = (long long)m * in0;
        s_u8_to_float<<<nn_blocks(nx), NN_THREADS, 0, s->stream>>>(s->d_act[0], s->d_px, nx);
        NN_CUDA_LAUNCHED();
        NN_CUBLAS_CHECK(cublasSetStream(s_handle, s->stream));
        int cur = 0;
        for (int l = 0; l < last; l++) {
            /* row-major out (m, OC) = inp (m, C) @ W^T, W (OC, C): column-major out^T = W^T(op) * inp^T */
            NN_CUBLAS_CHECK(cublasSgemm(s_handle, CUBLAS_OP_T, CUBLAS_OP_N, out[l], m, in[l], &one, w[l], in[l],
                                        s->d_act[cur], in[l], &zero, s->d_act[1 - cur], out[l]));
            cur = 1 - cur;
            long long no = (long long)m * out[l];
            s_bias_act<<<nn_blocks(no), NN_THREADS, 0, s->stream>>>(s->d_act[cur], b[l], no, out[l], l < n_hidden);
            NN_CUDA_LAUNCHED();
            if (l == n_hidden - 1 && emb) {
                NN_CUDA_CHECK(cudaMemcpyAsync(s->h_emb, s->d_act[cur], sizeof(float) * (size_t)m * E,
                                              cudaMemcpyDeviceToHost, s->stream));
            }
        }
        if (C) {
            s_softmax_rows<<<(m + 127) / 128, 128, 0, s->stream>>>(s->d_probs, s->d_act[cur], m, C);
            NN_CUDA_LAUNCHED();
            NN_CUDA_CHECK(cudaMemcpyAsync(s->h_probs, s->d_probs, sizeof(float) * (size_t)m * C,
                                          cudaMemcpyDeviceToHost, s->stream));
        }
    }
    for (int s = 0; s < ENC_SLOTS; s++) {
        s_drain(&slot[s], E, C, emb, probs);
    }
    NN_CUBLAS_CHECK(cublasSetStream(s_handle, 0));
    for (int s = 0; s < ENC_SLOTS; s++) {
        NN_CUDA_CHECK(cudaFreeHost(slot[s].h_px));
        NN_CUDA_CHECK(cudaFreeHost(slot[s].h_emb));
        NN_CUDA_CHECK(cudaFree(slot[s].d_px));
        NN_CUDA_CHECK(cudaFree(slot[s].d_act[0]));
        NN_CUDA_CHECK(cudaFree(slot[s].d_act[1]));
        if (C) {
            NN_CUDA_CHECK(cudaFreeHost(slot[s].h_probs));
            NN_CUDA_CHECK(cudaFree(slot[s].d_probs));
        }
        NN_CUDA_CHECK(cudaStreamDestroy(slot[s].stream));
    }
}
