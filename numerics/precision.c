/* Precision policies (see the table in mf_numerics.h). */
#include "mf_numerics.h"

#include <stdlib.h>
#include <string.h>

static void all(mf_precision *p, mf_dtype t) {
    p->act = t;
    for (int i = 0; i < MF_PART_COUNT; i++) p->part[i] = t;
    p->weights = t;
    p->opmath = t == MF_F64 ? MF_F64 : MF_F32;
    p->compute = p->opmath;
}

int mf_precision_parse(mf_precision *p, const char *name, mf_error *err) {
    memset(p, 0, sizeof *p);
    if (strlen(name) >= sizeof p->name) return mf_fail(err, MF_EINVAL, "precision \"%.40s...\" is too long", name);
    snprintf(p->name, sizeof p->name, "%s", name);
    if (!strcmp(name, "fp64")) all(p, MF_F64);
    else if (!strcmp(name, "fp32")) all(p, MF_F32);
    else if (!strcmp(name, "bf16")) all(p, MF_BF16);
    else if (!strcmp(name, "fp16")) all(p, MF_F16);
    else if (!strcmp(name, "layercast")) {
        all(p, MF_F32);
        p->weights = MF_BF16;
    } else if (!strcmp(name, "nomlp")) {
        all(p, MF_F32);
        p->weights = MF_BF16;
        p->part[MF_PART_MLP] = p->part[MF_PART_ROUTER] = MF_BF16;
    } else if (!strncmp(name, "selective:", 10)) {
        all(p, MF_BF16);
        char buf[64];
        snprintf(buf, sizeof buf, "%s", name + 10);
        if (!buf[0]) return mf_fail(err, MF_EINVAL, "precision \"%s\": name the parts (attn, norm, mlp, router, head, firstN, lastN, blocks)", name);
        char *save = NULL;
        for (char *tok = strtok_r(buf, "+", &save); tok; tok = strtok_r(NULL, "+", &save)) {
            int n = 0;
            char *end;
            if (!strcmp(tok, "attn")) p->part[MF_PART_ATTN] = MF_F32;
            else if (!strcmp(tok, "norm")) p->part[MF_PART_NORM] = MF_F32;
            else if (!strcmp(tok, "mlp")) p->part[MF_PART_MLP] = p->part[MF_PART_ROUTER] = MF_F32;
            else if (!strcmp(tok, "router")) p->part[MF_PART_ROUTER] = MF_F32;
            else if (!strcmp(tok, "head")) p->part[MF_PART_HEAD] = MF_F32;
            else if (!strcmp(tok, "blocks") || !strncmp(tok, "first", 5) || !strncmp(tok, "last", 4)) {
                if (p->blocks != MF_BLOCKS_NONE)
                    return mf_fail(err, MF_EINVAL, "precision \"%s\": at most one of firstN, lastN, blocks", name);
                if (!strcmp(tok, "blocks")) p->blocks = MF_BLOCKS_ALL;
                else {
                    const char *num = tok + (tok[0] == 'f' ? 5 : 4);
                    n = (int)strtol(num, &end, 10);
                    if (!*num || *end || n < 1) return mf_fail(err, MF_EINVAL, "precision \"%s\": \"%s\" needs a positive N", name, tok);
                    p->blocks = tok[0] == 'f' ? MF_BLOCKS_FIRST : MF_BLOCKS_LAST;
                    p->blocks_n = n;
                }
            } else {
                return mf_fail(err, MF_EINVAL,
                               "precision \"%s\": unknown part \"%s\" (attn, norm, mlp, router, head, firstN, lastN, blocks)",
                               name, tok);
            }
        }
    } else {
        return mf_fail(err, MF_EINVAL,
                       "unknown precision \"%s\" (fp64, fp32, bf16, fp16, layercast, nomlp, selective:<parts>)", name);
    }
    return MF_OK;
}

bool mf_precision_layer_fp32(const mf_precision *p, int l, int n_layers) {
    switch (p->blocks) {
    case MF_BLOCKS_ALL: return true;
    case MF_BLOCKS_FIRST: return l < p->blocks_n;
    case MF_BLOCKS_LAST: return l >= n_layers - p->blocks_n;
    default: return false;
    }
}

static int width(mf_dtype t) { return t == MF_F64 ? 3 : t == MF_F32 ? 2 : 1; }

mf_dtype mf_precision_widest(const mf_precision *p, mf_part part) {
    mf_dtype t = p->part[part];
    if (p->blocks != MF_BLOCKS_NONE && part != MF_PART_HEAD && width(MF_F32) > width(t)) t = MF_F32;
    if (part == MF_PART_ROUTER && width(p->part[MF_PART_MLP]) > width(t)) t = p->part[MF_PART_MLP];
    return t;
}
