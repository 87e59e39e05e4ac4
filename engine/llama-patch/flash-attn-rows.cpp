// skillhost: fused attention for the steps below ggml's tiled kernel (fewer
// than 64 query rows: decode steps, drafted steps), inserted into ggml-cpu's
// ops.cpp by engine/llama-patch/patch.cmake.
//
// Why: ggml's own kernel for such steps (..._f16_one_chunk) takes one row
// and one cell at a time: it widens the cell's K and V rows from f16, calls
// a dot product, an expf and an f16 multiply-add, each cell waiting on the
// one before. A drafted step of 17 positions does all of that 17 times per
// cell and head, which made a drafted position cost more on the fused
// kernel than on the unfused ones.
//
// How: each thread takes one share of the step's rows (patch.cmake's edit
// to the dispatcher); the rows of its share that read the same K and V
// (query heads sharing a K/V head included) are taken as a group, and the
// cells a block of SKILLHOST_FA_CELLS at a time, as ggml's tiled kernel does
// for 64 rows: each block's K and V rows are widened to f32 once for the
// group; then for each row the block's scores (eight cells at a time, in
// f32), their maximum and exponentials (ggml_vec_soft_max_f32), and the
// weighted sum of V rows into an f32 accumulator, with the usual rescaling
// when the maximum grows.
//
// Exactness: a row's result does not depend on the rows beside it. Each row
// takes the same operations in the same order whatever its group holds: the
// blocks start at cell 0 and hold SKILLHOST_FA_CELLS cells whatever the
// step, cells past the cache's end are padded with scores of -inf, a cell
// masked for the row weighs exactly 0, and a block masked for the whole
// row, or for the whole group, is passed over without changing the row. Every
// step below 64 rows runs this code, a lone row included, so a drafted step
// gives each position the logits an undrafted step gives it. Where this code
// does not apply (another K or V type, a head size not a multiple of 32, no
// AVX2), ggml's own per-row kernel runs, whose rows are also whole (the
// patch's other edit to ops.cpp).

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

// The largest head size the stack buffers below hold.
static constexpr int64_t SKILLHOST_FA_MAX_D = 256;
// Rows of one head taken together.
static constexpr int64_t SKILLHOST_FA_GROUP = 32;
// Cells per block: a multiple of 8 (one AVX register of scores).
static constexpr int64_t SKILLHOST_FA_CELLS = 32;

static bool skillhost_fa_rows_fit(const ggml_tensor * dst) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    return q->type == GGML_TYPE_F32 && k->type == GGML_TYPE_F16 && v->type == GGML_TYPE_F16 &&
           k->ne[0] % 32 == 0 && v->ne[0] % 32 == 0 &&
           k->ne[0] <= SKILLHOST_FA_MAX_D && v->ne[0] <= SKILLHOST_FA_MAX_D;
}

// Lane i of the result: the sum of the lanes of v[i].
static inline __m256 skillhost_fa_sum8(const __m256 * v) {
    const __m256 a01 = _mm256_hadd_ps(v[0], v[1]);
    const __m256 a23 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 a45 = _mm256_hadd_ps(v[4], v[5]);
    const __m256 a67 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 b03 = _mm256_hadd_ps(a01, a23);
    const __m256 b47 = _mm256_hadd_ps(a45, a67);
    return _mm256_add_ps(_mm256_permute2f128_ps(b03, b47, 0x20), _mm256_permute2f128_ps(b03, b47, 0x31));
}

// acc[0..8*R) += w[c] * v[c*stride..] for each of n cells in order, each
// value summed over the cells in the same order whatever R is; a weight of
// exactly 0 (a masked cell) adds nothing.
template <int R>
static inline void skillhost_fa_mad(float * acc, const float * v, int64_t stride, const float * w, int64_t n) {
    __m256 a[R];
    for (int i = 0; i < R; ++i) {
        a[i] = _mm256_load_ps(acc + 8*i);
    }
    for (int64_t c = 0; c < n; ++c) {
        if (w[c] == 0.0f) {
            continue;
        }
        const __m256 wc = _mm256_set1_ps(w[c]);
        for (int i = 0; i < R; ++i) {
            a[i] = _mm256_fmadd_ps(wc, _mm256_load_ps(v + c*stride + 8*i), a[i]);
        }
    }
    for (int i = 0; i < R; ++i) {
        _mm256_store_ps(acc + 8*i, a[i]);
    }
}

static void skillhost_fa_rows(const ggml_compute_params * params, ggml_tensor * dst, int64_t ir0, int64_t ir1) {
    const ggml_tensor * q     = dst->src[0];
    const ggml_tensor * k     = dst->src[1];
    const ggml_tensor * v     = dst->src[2];
    const ggml_tensor * mask  = dst->src[3];
    const ggml_tensor * sinks = dst->src[4];

    GGML_TENSOR_LOCALS(int64_t, neq, q,   ne)
    GGML_TENSOR_LOCALS(size_t,  nbq, q,   nb)
    GGML_TENSOR_LOCALS(int64_t, nek, k,   ne)
    GGML_TENSOR_LOCALS(size_t,  nbk, k,   nb)
    GGML_TENSOR_LOCALS(int64_t, nev, v,   ne)
    GGML_TENSOR_LOCALS(size_t,  nbv, v,   nb)
    GGML_TENSOR_LOCALS(int64_t, ne,  dst, ne)
    GGML_TENSOR_LOCALS(size_t,  nb,  dst, nb)
    GGML_UNUSED(params);

    const int64_t DK = nek0;
    const int64_t DV = nev0;

    const int64_t rk2 = neq2/nek2;
    const int64_t rk3 = neq3/nek3;
    const int64_t rv2 = neq2/nev2;
    const int64_t rv3 = neq3/nev3;

    float scale         = 1.0f;
    float max_bias      = 0.0f;
    float logit_softcap = 0.0f;

    memcpy(&scale,         (float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias,      (float *) dst->op_params + 1, sizeof(float));
    memcpy(&logit_softcap, (float *) dst->op_params + 2, sizeof(float));

    if (logit_softcap != 0) {
        scale /= logit_softcap;
    }

    const uint32_t n_head      = neq2;
    const uint32_t n_head_log2 = 1u << (uint32_t) floor(log2(n_head));

    const float m0 = powf(2.0f, -(max_bias       ) / n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);

    constexpr int64_t C = SKILLHOST_FA_CELLS;

    alignas(32) float qf[SKILLHOST_FA_GROUP][SKILLHOST_FA_MAX_D];
    alignas(32) float acc[SKILLHOST_FA_GROUP][SKILLHOST_FA_MAX_D];
    alignas(32) float sc[SKILLHOST_FA_GROUP][C];
    // A block's K and V rows, widened, one after another (rows 1 KiB apart
    // would share a few cache sets and evict each other).
    alignas(32) float k32[C*SKILLHOST_FA_MAX_D];
    alignas(32) float v32[C*SKILLHOST_FA_MAX_D];
    float S[SKILLHOST_FA_GROUP];
    float M[SKILLHOST_FA_GROUP];
    bool live[SKILLHOST_FA_GROUP];
    const ggml_fp16_t * mp[SKILLHOST_FA_GROUP];
    int64_t head[SKILLHOST_FA_GROUP];
    int64_t pos[SKILLHOST_FA_GROUP];
    float slope[SKILLHOST_FA_GROUP];

    for (int64_t ir = ir0; ir < ir1; ) {
        // Rows are ordered by query position within a head, and heads that
        // share a K/V head (grouped-query attention) are neighbours, so a
        // group is the run of this range's rows from `ir` that reads the
        // same K and V.
        const int64_t iq3 = ir/(neq2*neq1);
        const int64_t ik3 = iq3 / rk3;
        const int64_t iv3 = iq3 / rv3;
        const int64_t ik2 = (ir - iq3*neq2*neq1)/neq1 / rk2;
        const int64_t iv2 = (ir - iq3*neq2*neq1)/neq1 / rv2;

        int64_t rows = 0;
        for (; rows < SKILLHOST_FA_GROUP && ir + rows < ir1; ++rows) {
            const int64_t at = ir + rows;
            const int64_t h3 = at/(neq2*neq1);
            const int64_t h2 = (at - h3*neq2*neq1)/neq1;
            if (h3 != iq3 || h2/rk2 != ik2 || h2/rv2 != iv2) {
                break;
            }
            head[rows] = h2;
            pos[rows] = at - h3*neq2*neq1 - h2*neq1;
        }

        for (int64_t r = 0; r < rows; ++r) {
            const uint32_t h = head[r];
            slope[r] = (max_bias > 0.0f) ? h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2*(h - n_head_log2) + 1) : 1.0f;
            S[r] = 0.0f;
            M[r] = -INFINITY;
            memset(acc[r], 0, DV*sizeof(float));
            mp[r] = mask ? (const ggml_fp16_t *)((const char *) mask->data + pos[r]*mask->nb[1] + (head[r]%mask->ne[2])*mask->nb[2] + (iq3%mask->ne[3])*mask->nb[3]) : NULL;
            memcpy(qf[r], (const char *) q->data + (pos[r]*nbq1 + head[r]*nbq2 + iq3*nbq3), DK*sizeof(float));
        }

        for (int64_t ic0 = 0; ic0 < nek1; ic0 += C) {
            const int64_t n = std::min(C, nek1 - ic0);

            // The mask's values start each row's scores; a block with no
            // cell any row may see is never read.
            bool wanted = false;
            for (int64_t r = 0; r < rows; ++r) {
                live[r] = false;
                for (int64_t c = 0; c < n; ++c) {
                    sc[r][c] = mp[r] ? slope[r]*GGML_CPU_FP16_TO_FP32(mp[r][ic0 + c]) : 0.0f;
                    live[r] |= sc[r][c] != -INFINITY;
                }
                for (int64_t c = n; c < C; ++c) {
                    sc[r][c] = -INFINITY;
                }
                wanted |= live[r];
            }
            if (!wanted) {
                continue;
            }

            for (int64_t c = 0; c < n; ++c) {
                const ggml_fp16_t * kc = (const ggml_fp16_t *) ((const char *) k->data + ((ic0 + c)*nbk1 + ik2*nbk2 + ik3*nbk3));
                const ggml_fp16_t * vc = (const ggml_fp16_t *) ((const char *) v->data + ((ic0 + c)*nbv1 + iv2*nbv2 + iv3*nbv3));
                for (int64_t d = 0; d < DK; d += 8) {
                    _mm256_store_ps(k32 + c*DK + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (kc + d))));
                }
                for (int64_t d = 0; d < DV; d += 8) {
                    _mm256_store_ps(v32 + c*DV + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (vc + d))));
                }
            }
            // Past the cache's end: finite scores, which the -inf above masks.
            memset(k32 + n*DK, 0, (C - n)*DK*sizeof(float));

            for (int64_t r = 0; r < rows; ++r) {
                if (!live[r]) {
                    continue;
                }

                // Scores, eight cells at a time: scale, cap, then the mask.
                for (int64_t c8 = 0; c8 < C; c8 += 8) {
                    __m256 dot[8];
                    for (int64_t j = 0; j < 8; ++j) {
                        dot[j] = _mm256_setzero_ps();
                    }
                    for (int64_t d = 0; d < DK; d += 8) {
                        const __m256 qd = _mm256_load_ps(qf[r] + d);
                        for (int64_t j = 0; j < 8; ++j) {
                            dot[j] = _mm256_fmadd_ps(_mm256_load_ps(k32 + (c8 + j)*DK + d), qd, dot[j]);
                        }
                    }
                    __m256 s = _mm256_mul_ps(skillhost_fa_sum8(dot), _mm256_set1_ps(scale));
                    if (logit_softcap != 0.0f) {
                        alignas(32) float t[8];
                        _mm256_store_ps(t, s);
                        for (int j = 0; j < 8; ++j) {
                            t[j] = logit_softcap*tanhf(t[j]);
                        }
                        s = _mm256_load_ps(t);
                    }
                    _mm256_store_ps(sc[r] + c8, _mm256_add_ps(s, _mm256_load_ps(sc[r] + c8)));
                }

                __m256 mx = _mm256_load_ps(sc[r]);
                for (int64_t c8 = 8; c8 < C; c8 += 8) {
                    mx = _mm256_max_ps(mx, _mm256_load_ps(sc[r] + c8));
                }
                __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
                m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
                m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
                const float block_max = _mm_cvtss_f32(m4);
                const float Mnew = fmaxf(M[r], block_max);
                if (Mnew > M[r]) {
                    const float ms = expf(M[r] - Mnew);
                    ggml_vec_scale_f32(DV, acc[r], ms);
                    S[r] *= ms;
                }
                M[r] = Mnew;
                S[r] += (float) ggml_vec_soft_max_f32(C, sc[r], sc[r], Mnew);

                // acc += weight * V, eight registers of the row at a time
                // (four for a last 32 values).
                int64_t d = 0;
                for (; d + 64 <= DV; d += 64) {
                    skillhost_fa_mad<8>(acc[r] + d, v32 + d, DV, sc[r], n);
                }
                if (d < DV) {
                    skillhost_fa_mad<4>(acc[r] + d, v32 + d, DV, sc[r], n);
                }
            }
        }

        for (int64_t r = 0; r < rows; ++r) {
            if (sinks) {
                const float s = ((const float *)((const char *) sinks->data))[head[r]];

                float ms = 1.0f;
                float vs = 1.0f;

                if (s > M[r]) {
                    ms = expf(M[r] - s);
                    ggml_vec_scale_f32(DV, acc[r], ms);
                } else {
                    vs = expf(s - M[r]);
                }

                S[r] = S[r]*ms + vs;
            }

            const float S_inv = S[r] == 0.0f ? 0.0f : 1.0f/S[r];
            ggml_vec_scale_f32(DV, acc[r], S_inv);

            // permute(0, 2, 1, 3)
            memcpy((char *) dst->data + (iq3*ne2*ne1 + head[r] + pos[r]*ne1)*nb1, acc[r], nb1);
        }

        ir += rows;
    }
}

#else

static bool skillhost_fa_rows_fit(const ggml_tensor * dst) {
    GGML_UNUSED(dst);
    return false;
}

static void skillhost_fa_rows(const ggml_compute_params * params, ggml_tensor * dst, int64_t ir0, int64_t ir1) {
    GGML_UNUSED(params);
    GGML_UNUSED(dst);
    GGML_UNUSED(ir0);
    GGML_UNUSED(ir1);
    GGML_ABORT("skillhost_fa_rows without AVX2");
}

#endif

