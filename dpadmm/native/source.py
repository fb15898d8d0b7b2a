"""The C source of :mod:`dpadmm.native`, kept as a Python string so that it travels wherever the package
does (a Flower app bundle carries .py files only).

Two kernels, each the same mathematics as a torch function that stays the definition and the
fallback (and that the tests compare them with):

- ``dp_noise``: the keyed Philox-4x32-10 draws of :mod:`dpadmm.privacy.noise` (uniform, Laplace, Gaussian),
  the same bits: the 32-bit words come from integer arithmetic, the transforms repeat the torch
  path's float64 operations one by one in the same order. It is compiled with
  ``-ffp-contract=off`` and without fast-math, so that the compiler can neither fuse a multiply
  and an add nor reorder a sum; vectorising the independent elements changes no result.
- ``dp_logistic_grad``: g = scale X_p^T (clip(H - Y)) + 2 reg z of :func:`dpadmm.models.logistic.gradient`
  and the largest ||x_i||_1 ||h_i - y_i||_1 of eq. (9b), in one pass over each agent's rows held
  sparse (CSR): both products, the softmax and the clipping of a row are done while the row
  is in cache, and zero pixels cost nothing. Each agent's result is computed by one thread in
  an order fixed by the data, so it does not depend on the thread count or on which other
  agents are batched with it.
- ``dp_logistic_grad_sampled``: the same gradient over each run's Poisson sample (``sampling-rate`` q),
  reading only the rows some run took, row by row: about 1 - (1 - q)^S of the full pass's work.
"""

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* ------------------------------------------------------------------ threads */

typedef void (*task_fn)(void *ctx, int64_t item);

/* Run fn(ctx, item) for item = 0..items-1 on `threads` OpenMP threads. Which thread runs an item does not
   change its result. The threads are torch's own (the same libgomp.so.1 is loaded once per process), so
   the kernels do not compete with torch's pool, whose idle threads spin for a while after each region. */
static void parallel_for(task_fn fn, void *ctx, int64_t items, int threads) {
    #pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if(threads > 1 && items > 1)
    for (int64_t item = 0; item < items; item++) fn(ctx, item);
}

/* ------------------------------------------------------------------ Philox-4x32-10 */

#define M0 0xD2511F53u
#define M1 0xCD9E8D57u
#define W0 0x9E3779B9u
#define W1 0xBB67AE85u

INLINE void philox(uint32_t c[4], uint32_t k0, uint32_t k1) {
    _Pragma("GCC unroll 10") for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)M0 * c[0], p1 = (uint64_t)M1 * c[2];
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
        k0 += W0; k1 += W1;
    }
}

/* ------------------------------------------------------------------ float64 functions */
/* Each repeats dpadmm.privacy.noise's torch function of the same name operation by operation. */

INLINE double bits_to_double(int64_t b) { double d; memcpy(&d, &b, 8); return d; }
INLINE int64_t double_to_bits(double d) { int64_t b; memcpy(&b, &d, 8); return b; }

/* max(k, 1/2) * scale * 2**-21 with k the top 53 bits of (hi << 32) | lo (_unit). */
INLINE double unit(uint32_t hi, uint32_t lo, double scale) {
    double k = (double)((((uint64_t)hi << 32) | lo) >> 11);
    double u = k * (scale * 0x1p-21);
    double lowest = scale * 0x1p-22;
    return u < lowest ? lowest : u;
}

#define SQRT_HALF_BITS 0x3FE6A09E667F3BCDLL
#define MANT_MASK ((1LL << 52) - 1)

INLINE double log_(double t) {
    int64_t b = double_to_bits(t) - SQRT_HALF_BITS;
    double e = (double)(b >> 52);
    double m = bits_to_double((b & MANT_MASK) + SQRT_HALF_BITS);
    double f = m - 1.0;
    m = m + 1.0;
    f = f / m;
    double s = f * f;
    double p = s * LOG_C[8];
    _Pragma("GCC unroll 16") for (int j = 7; j >= 0; j--) { p = p + LOG_C[j]; p = p * s; }
    p = p * f;
    f = f * 2.0;
    p = p + f;
    p = p + e * LN2_LO;
    p = p + e * LN2_HI;
    return p;
}

INLINE double sqrt_(double x) {
    double y = bits_to_double((double_to_bits(x) >> 1) + SQRT_MAGIC);
    _Pragma("GCC unroll 16") for (int j = 0; j < 4; j++) { double q = x / y; q = q + y; y = q * 0.5; }
    return y;
}

INLINE void sincos_2pi(double u, double *sin_out, double *cos_out) {
    u = u * 4.0;
    double q = nearbyint(u);
    double x = u - q;
    x = x * HALF_PI;
    double z = x * x;
    double s = z * SIN_C[7];
    _Pragma("GCC unroll 16") for (int j = 6; j >= 0; j--) { s = s + SIN_C[j]; s = s * z; }
    s = s * x;
    s = s + x;
    double c = z * COS_C[7];
    _Pragma("GCC unroll 16") for (int j = 6; j >= 0; j--) { c = c + COS_C[j]; c = c * z; }
    c = c + 1.0;
    int64_t quad = (int64_t)q & 3;
    double sn = (quad & 1) ? c : s, cs = (quad & 1) ? s : c;
    int64_t sb = double_to_bits(sn) ^ ((quad >> 1) * INT64_MIN);
    int64_t cb = double_to_bits(cs) ^ ((((quad + 1) >> 1) & 1) * INT64_MIN);
    *sin_out = bits_to_double(sb);
    *cos_out = bits_to_double(cb);
}

/* ------------------------------------------------------------------ keyed draws */

enum { UNIFORM = 0, LAPLACE = 1, GAUSSIAN = 2 };
#define NOISE_TILE 1024  /* blocks (pairs of elements) per work item */

/* The inverse CDF of dpadmm.privacy.noise._laplace_transform on t = 2u: b log(min(t, 2 - t)), sign of
   t - 1. */
INLINE double laplace(double t, double b) {
    double sign = t - 1.0, r = -t;
    r = r + 2.0;
    t = t < r ? t : r;
    return copysign(log_(t) * b, sign);
}

typedef struct {
    int kind, out_float;
    uint32_t seed, round_, step, stream;
    const int64_t *agents;
    const double *param;
    int64_t numel, blocks, tiles;
    void *out;
} noise_job;

static void noise_item(void *ctx, int64_t item) {
    const noise_job *job = (const noise_job *)ctx;
    int64_t p = item / job->tiles, b0 = (item % job->tiles) * NOISE_TILE;
    int n = (int)(b0 + NOISE_TILE < job->blocks ? NOISE_TILE : job->blocks - b0);
    const uint32_t agent = (uint32_t)job->agents[p], seed = job->seed;
    const uint32_t step = job->step, round_ = job->round_, stream = job->stream;
    const double param = job->param ? job->param[p] : 0.0;
    uint32_t w0[NOISE_TILE], w1[NOISE_TILE], w2[NOISE_TILE], w3[NOISE_TILE];
    double v0[NOISE_TILE], v1[NOISE_TILE];
    /* Stages over the tile, each a loop of independent elements (vectorised by the compiler). */
    for (int i = 0; i < n; i++) {
        uint32_t w[4] = {(uint32_t)(b0 + i), step, round_, stream};
        philox(w, seed, agent);
        w0[i] = w[0]; w1[i] = w[1]; w2[i] = w[2]; w3[i] = w[3];
    }
    const double unit_scale = job->kind == LAPLACE ? 0x1p-31 : 0x1p-32;  /* Laplace transforms t = 2u */
    for (int i = 0; i < n; i++) {
        v0[i] = unit(w0[i], w1[i], unit_scale);
        v1[i] = unit(w2[i], w3[i], unit_scale);
    }
    if (job->kind == LAPLACE) {
        for (int i = 0; i < n; i++) v0[i] = laplace(v0[i], param);
        for (int i = 0; i < n; i++) v1[i] = laplace(v1[i], param);
    } else if (job->kind == GAUSSIAN) {
        for (int i = 0; i < n; i++) {
            double r = log_(v0[i]);
            r = r * -2.0;
            r = sqrt_(r);
            v0[i] = r * param;
        }
        for (int i = 0; i < n; i++) {
            double sn, cs;
            sincos_2pi(v1[i], &sn, &cs);
            v1[i] = v0[i] * sn;
            v0[i] = v0[i] * cs;
        }
    }
    const int64_t e0 = 2 * b0, m = 2 * (int64_t)n <= job->numel - e0 ? 2 * (int64_t)n : job->numel - e0;
    /* Element 2i is v0[i], 2i + 1 is v1[i]: written pair by pair (a loop the compiler vectorises into
       interleaving stores; choosing per element does not vectorise and cost a third of a draw). */
    const int64_t pairs = m / 2;
    if (job->out_float) {
        float *out = (float *)job->out + p * job->numel + e0;
        for (int64_t i = 0; i < pairs; i++) { out[2 * i] = (float)v0[i]; out[2 * i + 1] = (float)v1[i]; }
        if (m & 1) out[m - 1] = (float)v0[pairs];
    } else {
        double *out = (double *)job->out + p * job->numel + e0;
        for (int64_t i = 0; i < pairs; i++) { out[2 * i] = v0[i]; out[2 * i + 1] = v1[i]; }
        if (m & 1) out[m - 1] = v0[pairs];
    }
}

/* [P, numel] draws of (seed, agents[p], round_, step, stream) into out (float64, or float32 when
   out_float), as dpadmm.privacy.noise.uniform / laplace / gaussian compute them. */
void dp_noise(int kind, uint32_t seed, const int64_t *agents, int64_t num_agents, uint32_t round_,
              uint32_t step, uint32_t stream, int64_t numel, const double *param, void *out, int out_float,
              int threads) {
    noise_job job = {kind, out_float, seed, round_, step, stream, agents, param, numel, (numel + 1) / 2, 0,
                     out};
    job.tiles = (job.blocks + NOISE_TILE - 1) / NOISE_TILE;
    parallel_for(noise_item, &job, num_agents * job.tiles, threads);
}

/* ------------------------------------------------------------------ logistic gradient */

/* exp(x) for x <= 0 (a softmax's shifted logits): x = n ln 2 + r, |r| <= ln(2)/2, Taylor series of degree 13
   for e**r (truncation below 4e-18), times 2**n from the bit pattern; 0 below -708. Plain arithmetic, so it
   vectorises and gives the same bits on every machine. */
INLINE double exp_neg(double x0) {
    const int ok = x0 >= -708.0;  /* no branch: a row's exponentials vectorise */
    const double x = ok ? x0 : -708.0;
    double n = nearbyint(x * 1.4426950408889634);
    double r = x - n * LN2_HI;
    r = r - n * LN2_LO;
    double p = EXP_C[13];
    _Pragma("GCC unroll 16") for (int j = 12; j >= 0; j--) { p = p * r; p = p + EXP_C[j]; }
    p = p * bits_to_double((int64_t)(n + 1023.0) << 52);
    return ok ? p : 0.0;
}

/* A loop over the NR < L2 values of a row's tail: a constant bound, so that it unrolls into branches that
   always go the same way and the tail's values stay in registers (a loop to NR made the gradient on
   MNIST's rows of 10 float32 values twice as slow). */
#define TAIL(v) _Pragma("GCC unroll 4") for (int64_t v = 0; v < L2 - 1; v++) if (v < NR)

typedef double vec_f64 __attribute__((vector_size(64)));
typedef double vec2_f64 __attribute__((vector_size(16)));
typedef float vec_f32 __attribute__((vector_size(64)));
typedef float vec2_f32 __attribute__((vector_size(16)));
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
"""

# The column blocks and the logistic gradient for one floating-point type: source() pastes this once per
# type, with real_t, vec_t (64 bytes), vec2_t (16 bytes) and FN(name) (name_f64 or name_f32) defined
# before it, then the specialisations of agent() for the widths that occur (SPECIALISED below).
GRADIENT = r"""
/* Column blocks of x [P, I, J]: each agent's rows in blocks of ROW_BLOCK, and in each block the columns
   that hold a nonzero, each with its entries (row within the block, value) in row order:
   block (p, b) has columns blk[p nb + b] .. blk[p nb + b + 1] - 1, column c is number col[c] and has
   entries ptr[c] .. ptr[c + 1] - 1. Pass 1 (fill = 0) counts columns and entries per block into blk
   and ptr[0] (totals returned through them); pass 2 fills. */
void FN(dp_blocks)(const real_t *x, int64_t P, int64_t I, int64_t J, int fill, int64_t *blk, int32_t *col,
                   int64_t *ptr, uint8_t *row, real_t *val) {
    const int64_t nb = (I + ROW_BLOCK - 1) / ROW_BLOCK;
    int64_t columns = 0, entries = 0;
    if (!fill) blk[0] = 0;
    for (int64_t p = 0; p < P; p++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t i0 = b * ROW_BLOCK, i1 = i0 + ROW_BLOCK < I ? i0 + ROW_BLOCK : I;
            const real_t *xb = x + (p * I + i0) * J;
            for (int64_t j = 0; j < J; j++) {
                int64_t n = 0;
                for (int64_t i = 0; i < i1 - i0; i++)
                    if (xb[i * J + j] != 0) {
                        if (fill) { row[entries + n] = (uint8_t)i; val[entries + n] = xb[i * J + j]; }
                        n++;
                    }
                if (!n) continue;
                if (fill) { col[columns] = (int32_t)j; ptr[columns] = entries; }
                columns++;
                entries += n;
            }
            if (!fill) blk[p * nb + b + 1] = columns;
        }
    if (fill) ptr[columns] = entries; else ptr[0] = entries;
}

typedef struct {
    int64_t I, J, K, S, W, NV, NT, NR;
    const int64_t *blk; const int32_t *col; const int64_t *ptr; const uint8_t *row; const real_t *val;
    const real_t *y, *x_l1, *x_l2, *zt, *scale;
    double clip, twice_reg; int l2;
    real_t *g; double *worst;
    /* the sampled gradient's: the rows row by row (CSR: rowptr [P I + 1], rcol, rval), the rows some run
       took (rows[first[p] .. first[p + 1]) of agent p) and which runs took them (taken [P, I, S]) */
    const int64_t *rowptr; const int32_t *rcol; const real_t *rval;
    const int64_t *rows, *first; const uint8_t *taken;
} FN(job_t);

/* r[0:S K] = clip(softmax(x_i z_s) - y_i) for each run s, from the logits in r; worst[s] (unless worst is
   NULL) is the largest ||x_i||_1 ||softmax - y_i||_1 so far (eq. (9b) times I). With ``taken`` (a row's S
   flags), a run that did not take the row gets r = 0. */
INLINE void FN(residual)(const FN(job_t) *job, int64_t i, real_t *restrict r, double *worst,
                         const uint8_t *taken) {
    const int64_t K = job->K;
    const real_t *yi = job->y + i * K;
    const double xl1 = job->x_l1[i], xl2 = job->x_l2[i];
    for (int64_t s = 0; s < job->S; s++) {
        real_t *rs = r + s * K;
        if (taken && !taken[s]) {
            for (int64_t k = 0; k < K; k++) rs[k] = 0;
            continue;
        }
        real_t m = rs[0];
        for (int64_t k = 1; k < K; k++) m = rs[k] > m ? rs[k] : m;
        for (int64_t k = 0; k < K; k++) rs[k] = (real_t)exp_neg((double)(rs[k] - m));
        double total = 0.0;
        for (int64_t k = 0; k < K; k++) total += rs[k];
        const real_t inv = (real_t)(1.0 / total);
        double l1 = 0.0, sq = 0.0;
        for (int64_t k = 0; k < K; k++) {
            rs[k] = rs[k] * inv - yi[k];
            l1 += fabs((double)rs[k]);
            sq += (double)rs[k] * rs[k];
        }
        const double d = xl1 * l1;
        if (worst && d > worst[s]) worst[s] = d;
        if (job->clip > 0) {
            /* total clipping: a term whose norm is not finite (logits that overflowed on a server's extreme
               z) is dropped, a rule that stays within C and never fails on the data */
            const double n = job->l2 ? xl2 * sqrt(sq) : d;
            if (!isfinite(n)) for (int64_t k = 0; k < K; k++) rs[k] = 0;
            else if (job->clip < n) for (int64_t k = 0; k < K; k++) rs[k] = (real_t)(rs[k] * (job->clip / n));
        }
    }
}

/* g = scale_p g + 2 reg z: an agent's summed terms made its gradient (both kernels' last step). */
INLINE void FN(finish)(const FN(job_t) *job, int64_t p, real_t *restrict g, const real_t *zt) {
    const real_t sc = job->scale[p], tr = (real_t)job->twice_reg;
    for (int64_t j = 0; j < job->J * job->W; j++) g[j] = sc * g[j] + tr * zt[j];
}

INLINE vec_t FN(load)(const real_t *p) { vec_t v; memcpy(&v, p, sizeof v); return v; }
INLINE vec2_t FN(load2)(const real_t *p) { vec2_t v; memcpy(&v, p, sizeof v); return v; }
INLINE void FN(store)(real_t *p, vec_t v) { memcpy(p, &v, sizeof v); }
INLINE void FN(store2)(real_t *p, vec2_t v) { memcpy(p, &v, sizeof v); }

/* One agent's g = scale X^T clip(H - Y) + 2 reg z, block of rows by block of rows, over rows of width
   W = NV 64-byte vectors, NT 16-byte ones and NR single values (NV and NT constants in the
   specialisations, so that a column's z and g stay in registers; the tail's NR values, less than 16
   bytes, are done one by one with a vector lane's operations, so no row is padded). In a block, each
   nonzero column's z_j is read once and added into the logits of its rows (which stay in cache); then
   each row's residual; then each column's sum of x_ij r_i is added to g_j once. A logit is the sum over
   j in increasing order, a block's part of g_j the sum over i in increasing order, blocks in order:
   fixed by the data alone. */
INLINE void FN(agent)(const FN(job_t) *job, int64_t p, const int64_t NV, const int64_t NT) {
    const int64_t I = job->I, J = job->J, L = sizeof(vec_t) / sizeof(real_t);
    const int64_t L2 = sizeof(vec2_t) / sizeof(real_t), O = NV * L + NT * L2, NR = job->NR, W = O + NR;
    const int64_t nb = (I + ROW_BLOCK - 1) / ROW_BLOCK;
    const real_t *zt = job->zt + p * J * W;
    real_t *g = job->g + p * J * W;
    double *worst = job->worst + p * job->S;
    memset(g, 0, sizeof(real_t) * J * W);
    for (int64_t s = 0; s < job->S; s++) worst[s] = 0.0;
    real_t *logits = malloc(sizeof(real_t) * ROW_BLOCK * W);
    vec_t z[NV + 1];
    vec2_t z2[NT + 1];
    real_t z1[sizeof(vec2_t) / sizeof(real_t)];
    for (int64_t b = 0; b < nb; b++) {
        const int64_t i0 = b * ROW_BLOCK, rows = i0 + ROW_BLOCK < I ? ROW_BLOCK : I - i0;
        const int64_t c0 = job->blk[p * nb + b], c1 = job->blk[p * nb + b + 1];
        memset(logits, 0, sizeof(real_t) * rows * W);
        for (int64_t c = c0; c < c1; c++) { /* the logits x_i z */
            const real_t *zj = zt + (int64_t)job->col[c] * W;
            for (int64_t v = 0; v < NV; v++) z[v] = FN(load)(zj + v * L);
            for (int64_t v = 0; v < NT; v++) z2[v] = FN(load2)(zj + NV * L + v * L2);
            TAIL(v) z1[v] = zj[O + v];
            for (int64_t e = job->ptr[c]; e < job->ptr[c + 1]; e++) {
                const real_t x = job->val[e];
                real_t *li = logits + job->row[e] * W;
                for (int64_t v = 0; v < NV; v++) FN(store)(li + v * L, FN(load)(li + v * L) + x * z[v]);
                for (int64_t v = 0; v < NT; v++)
                    FN(store2)(li + NV * L + v * L2, FN(load2)(li + NV * L + v * L2) + x * z2[v]);
                TAIL(v) li[O + v] = li[O + v] + x * z1[v];
            }
        }
        for (int64_t i = 0; i < rows; i++) /* the residuals, in place; x_i = 0 (padding) adds nothing */
            if (job->x_l1[p * I + i0 + i] != 0)
                FN(residual)(job, p * I + i0 + i, logits + i * W, worst, NULL);
        for (int64_t c = c0; c < c1; c++) { /* g_j += sum_i x_ij r_i */
            for (int64_t v = 0; v < NV; v++) z[v] = (vec_t){0};
            for (int64_t v = 0; v < NT; v++) z2[v] = (vec2_t){0};
            TAIL(v) z1[v] = 0;
            for (int64_t e = job->ptr[c]; e < job->ptr[c + 1]; e++) {
                const real_t x = job->val[e], *ri = logits + job->row[e] * W;
                for (int64_t v = 0; v < NV; v++) z[v] += x * FN(load)(ri + v * L);
                for (int64_t v = 0; v < NT; v++) z2[v] += x * FN(load2)(ri + NV * L + v * L2);
                TAIL(v) z1[v] += x * ri[O + v];
            }
            real_t *gj = g + (int64_t)job->col[c] * W;
            for (int64_t v = 0; v < NV; v++) FN(store)(gj + v * L, FN(load)(gj + v * L) + z[v]);
            for (int64_t v = 0; v < NT; v++)
                FN(store2)(gj + NV * L + v * L2, FN(load2)(gj + NV * L + v * L2) + z2[v]);
            TAIL(v) gj[O + v] = gj[O + v] + z1[v];
        }
    }
    free(logits);
    FN(finish)(job, p, g, zt);
}

static void FN(any_width)(void *job, int64_t p) {
    const FN(job_t) *j = job;
    FN(agent)(j, p, j->NV, j->NT);
}

/* One agent's Poisson-sampled g = scale sum_s-sample clip(x_i (h_i - y_i)^T) + 2 reg z: for each row some
   run took, in increasing order, its logits (the sum over its nonzero columns in increasing order, in
   registers: NV 64-byte and NT 16-byte vectors and NR single values as in agent()), its residuals (zero
   for the runs that did not take it), and its terms added into g. The rows no run took are never read. */
INLINE void FN(sampled)(const FN(job_t) *job, int64_t p, const int64_t NV, const int64_t NT) {
    const int64_t I = job->I, J = job->J, S = job->S, W = job->W, L = sizeof(vec_t) / sizeof(real_t);
    const int64_t L2 = sizeof(vec2_t) / sizeof(real_t), O = NV * L + NT * L2, NR = job->NR;
    const real_t *zt = job->zt + p * J * W;
    real_t *g = job->g + p * J * W;
    memset(g, 0, sizeof(real_t) * J * W);
    real_t *r = malloc(sizeof(real_t) * W);
    vec_t acc[NV + 1];
    vec2_t acc2[NT + 1];
    real_t acc1[sizeof(vec2_t) / sizeof(real_t)];
    for (int64_t n = job->first[p]; n < job->first[p + 1]; n++) {
        const int64_t i = p * I + job->rows[n], e0 = job->rowptr[i], e1 = job->rowptr[i + 1];
        for (int64_t v = 0; v < NV; v++) acc[v] = (vec_t){0};
        for (int64_t v = 0; v < NT; v++) acc2[v] = (vec2_t){0};
        TAIL(v) acc1[v] = 0;
        for (int64_t e = e0; e < e1; e++) { /* the logits x_i z */
            const real_t x = job->rval[e], *zj = zt + (int64_t)job->rcol[e] * W;
            for (int64_t v = 0; v < NV; v++) acc[v] += x * FN(load)(zj + v * L);
            for (int64_t v = 0; v < NT; v++) acc2[v] += x * FN(load2)(zj + NV * L + v * L2);
            TAIL(v) acc1[v] += x * zj[O + v];
        }
        for (int64_t v = 0; v < NV; v++) FN(store)(r + v * L, acc[v]);
        for (int64_t v = 0; v < NT; v++) FN(store2)(r + NV * L + v * L2, acc2[v]);
        TAIL(v) r[O + v] = acc1[v];
        FN(residual)(job, i, r, NULL, job->taken + i * S); /* no eq. (9b) with sampling */
        for (int64_t v = 0; v < NV; v++) acc[v] = FN(load)(r + v * L);
        for (int64_t v = 0; v < NT; v++) acc2[v] = FN(load2)(r + NV * L + v * L2);
        TAIL(v) acc1[v] = r[O + v];
        for (int64_t e = e0; e < e1; e++) { /* g_j += x_ij r_i */
            const real_t x = job->rval[e];
            real_t *gj = g + (int64_t)job->rcol[e] * W;
            for (int64_t v = 0; v < NV; v++) FN(store)(gj + v * L, FN(load)(gj + v * L) + x * acc[v]);
            for (int64_t v = 0; v < NT; v++)
                FN(store2)(gj + NV * L + v * L2, FN(load2)(gj + NV * L + v * L2) + x * acc2[v]);
            TAIL(v) gj[O + v] = gj[O + v] + x * acc1[v];
        }
    }
    free(r);
    FN(finish)(job, p, g, zt);
}

static void FN(sampled_any_width)(void *job, int64_t p) {
    const FN(job_t) *j = job;
    FN(sampled)(j, p, j->NV, j->NT);
}
"""

# (64-byte vectors, 16-byte vectors) of the widths with their own compiled loop; any other width runs a
# generic loop (its width known at run time).
SPECIALISED = tuple((nv, nt) for nv in range(9) for nt in range(4) if nv + nt)

ENTRY = r"""
void FN(dp_logistic_grad)(int64_t P, int64_t I, int64_t J, int64_t K, int64_t S, int64_t W,
                          const int64_t *blk, const int32_t *col, const int64_t *ptr, const uint8_t *row,
                          const real_t *val, const real_t *y, const real_t *x_l1, const real_t *x_l2,
                          const real_t *zt, double clip, int l2, const real_t *scale, double twice_reg,
                          real_t *g, double *worst, int threads) {
    const int64_t L = sizeof(vec_t) / sizeof(real_t), L2 = sizeof(vec2_t) / sizeof(real_t);
    FN(job_t) job = {I, J, K, S, W, W / L, (W % L) / L2, W % L2, blk, col, ptr, row, val, y, x_l1, x_l2, zt,
                     scale, clip, twice_reg, l2, g, worst, NULL, NULL, NULL, NULL, NULL, NULL};
    task_fn fn = FN(any_width);
    for (int64_t i = 0; i < (int64_t)(sizeof FN(by_width) / sizeof FN(by_width)[0]); i++)
        if (FN(by_width)[i].nv == job.NV && FN(by_width)[i].nt == job.NT) fn = FN(by_width)[i].fn;
    parallel_for(fn, &job, P, threads);
}

void FN(dp_logistic_grad_sampled)(int64_t P, int64_t I, int64_t J, int64_t K, int64_t S, int64_t W,
                                  const int64_t *rowptr, const int32_t *rcol, const real_t *rval,
                                  const int64_t *rows, const int64_t *first, const uint8_t *taken,
                                  const real_t *y, const real_t *x_l1, const real_t *x_l2, const real_t *zt,
                                  double clip, int l2, const real_t *scale, double twice_reg, real_t *g,
                                  int threads) {
    const int64_t L = sizeof(vec_t) / sizeof(real_t), L2 = sizeof(vec2_t) / sizeof(real_t);
    FN(job_t) job = {.I = I, .J = J, .K = K, .S = S, .W = W, .NV = W / L, .NT = (W % L) / L2, .NR = W % L2,
                     .y = y, .x_l1 = x_l1, .x_l2 = x_l2, .zt = zt, .scale = scale, .clip = clip,
                     .twice_reg = twice_reg, .l2 = l2, .g = g, .rowptr = rowptr, .rcol = rcol, .rval = rval,
                     .rows = rows, .first = first, .taken = taken};
    task_fn fn = FN(sampled_any_width);
    for (int64_t i = 0; i < (int64_t)(sizeof FN(sampled_by_width) / sizeof FN(sampled_by_width)[0]); i++)
        if (FN(sampled_by_width)[i].nv == job.NV && FN(sampled_by_width)[i].nt == job.NT)
            fn = FN(sampled_by_width)[i].fn;
    parallel_for(fn, &job, P, threads);
}
"""
