/* The embedded default checkpoint (models/tiny-olmoe, or the one the build names): its files are built into the
 * program by cmake/embed.cmake, as mf_default_files; `moeflip sweep` with no --model writes them out. */
#include "mf_models.h"

#include <string.h>

extern const struct { const char *name; const unsigned char *data; size_t size; } mf_default_files[];
extern const size_t mf_default_file_count;

bool mf_default_has(const char *name) {
    for (size_t i = 0; i < mf_default_file_count; i++)
        if (!strcmp(mf_default_files[i].name, name)) return true;
    return false;
}

int mf_default_model_write(const char *dir, mf_error *err) {
    int rc = mf_mkdir_p(dir, err);
    char path[8400];
    for (size_t i = 0; !rc && i < mf_default_file_count; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, mf_default_files[i].name);
        rc = mf_write_file_atomic(path, mf_default_files[i].data, mf_default_files[i].size, err);
    }
    return rc;
}
