/* A drawing module as a build from other headers leaves it beside the program (test_module.c): the entry points
 * that libmoeflip_draw.so has, and, with STALE_ABI, another module interface version than this program's (without
 * it, none at all: a module from before modules said theirs). Nothing here is ever called. */
#include "mf_core.h"

#ifdef STALE_ABI
extern __attribute__((visibility("default"))) const unsigned mf_module_abi;
const unsigned mf_module_abi = STALE_ABI;
#endif

int mf_draw_heatmap_file(void) { return MF_EINVAL; }
int mf_draw_heatmap_svg(void) { return MF_EINVAL; }
