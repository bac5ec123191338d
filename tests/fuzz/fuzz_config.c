/* libFuzzer target: one input is a config.json. mf_config_parse must refuse it
 * with one message, or give a configuration the runtime can size by: positive
 * sizes, an even head_dim, 0 < top-k <= experts within the bounds, finite and
 * positive eps and rope theta. */
#include "fuzz_util.h"
#include "mf_models.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mf_config c;
    mf_error e = {0};
    const int rc = mf_config_parse(&c, (const char *)data, size, "config.json", &e);
    fuzz_check_refusal(rc, &e);
    if (rc) return 0;
    bool ok = c.vocab > 0 && c.hidden > 0 && c.n_layers > 0 && c.n_layers <= MF_MAX_LAYERS && c.n_heads > 0 && c.n_kv_heads > 0 &&
              c.n_heads % c.n_kv_heads == 0 && c.head_dim > 0 && c.head_dim % 2 == 0 && c.rms_eps > 0 && isfinite(c.rms_eps) &&
              c.rope.theta > 0 && isfinite(c.rope.theta) && c.max_pos > 0;
    if (c.n_moe_layers) ok = ok && c.n_experts > 0 && c.n_experts <= MF_MAX_EXPERTS && c.top_k > 0 && c.top_k <= c.n_experts &&
                             c.top_k <= MF_MAX_TOP_K && c.moe_intermediate > 0;
    int moe = 0;
    for (int l = 0; l < c.n_layers; l++) moe += c.layer_is_moe[l];
    ok = ok && moe == c.n_moe_layers;
    if (!ok) {
        fprintf(stderr, "fuzz: an accepted config the runtime cannot size by\n");
        abort();
    }
    return 0;
}
