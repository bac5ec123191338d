/* A Hub checkpoint directory: one model.safetensors, or shards listed in
 * model.safetensors.index.json ("weight_map": tensor name -> file name). */
#include "mf_models.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void mf_checkpoint_close(mf_checkpoint *c) {
    if (!c) return;
    for (size_t i = 0; i < c->nfiles; i++) mf_st_close(c->files[i]);
    free(c->files);
    free(c->dir);
    free(c);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool valid_shard_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, "..") != 0 && strcmp(s, ".") != 0;
}

int mf_checkpoint_open(mf_checkpoint **out, const char *dir, mf_error *err) {
    *out = NULL;
    char path[4096];
    mf_checkpoint *c = mf_xcalloc(1, sizeof *c);
    c->dir = mf_xstrdup(dir);
    int rc = MF_OK;
    json_t *root = NULL;
    char **names = NULL;
    size_t nnames = 0;
    if (!mf_path_join(path, sizeof path, dir, "model.safetensors.index.json")) {
        rc = mf_fail(err, MF_EINVAL, "%s: path too long", dir);
        goto done;
    }
    if (mf_path_exists(path)) {
        json_error_t jerr;
        root = json_load_file(path, 0, &jerr);
        json_t *map = root ? json_object_get(root, "weight_map") : NULL;
        if (!root || !json_is_object(map)) {
            rc = mf_fail(err, MF_EFORMAT, "%s: %s", path, root ? "no \"weight_map\" object" : jerr.text);
            goto done;
        }
        names = mf_xcalloc(json_object_size(map) + 1, sizeof *names);
        const char *key;
        json_t *v;
        json_object_foreach(map, key, v) {
            if (!json_is_string(v) || !valid_shard_name(json_string_value(v))) {
                rc = mf_fail(err, MF_EFORMAT, "%s: weight_map entry %s does not name a file in the directory", path, key);
                goto done;
            }
            const char *fn = json_string_value(v);
            bool seen = false;
            for (size_t i = 0; i < nnames && !seen; i++) seen = strcmp(names[i], fn) == 0;
            if (!seen) names[nnames++] = (char *)fn;
        }
        if (nnames == 0) {
            rc = mf_fail(err, MF_EFORMAT, "%s: weight_map is empty", path);
            goto done;
        }
    } else {
        names = mf_xcalloc(1, sizeof *names);
        names[nnames++] = "model.safetensors";
        if (!mf_path_join(path, sizeof path, dir, names[0]) || !mf_path_exists(path)) {
            rc = mf_fail(err, MF_EIO, "%s: no model.safetensors or model.safetensors.index.json", dir);
            goto done;
        }
    }
    qsort(names, nnames, sizeof *names, cmp_str);
    c->files = mf_xcalloc(nnames, sizeof *c->files);
    mf_digest_state *ds = mf_digest_new();
    for (size_t i = 0; i < nnames; i++) {
        mf_path_join(path, sizeof path, dir, names[i]);
        if ((rc = mf_st_open(&c->files[c->nfiles], path, err))) break;
        mf_st_file *f = c->files[c->nfiles++];
        char h[33];
        mf_digest_buffer(f->map.data, f->map.size, h);
        mf_digest_update(ds, names[i], strlen(names[i]) + 1);
        mf_digest_update(ds, h, 32);
    }
    mf_digest_final(ds, c->weights_digest);
    if (rc) goto done;
    if (root) {   /* every tensor the index names must be in the file it names */
        json_t *map = json_object_get(root, "weight_map");
        const char *key;
        json_t *v;
        json_object_foreach(map, key, v) {
            const char *fn = json_string_value(v);
            const mf_st_file *f = NULL;
            for (size_t i = 0; i < c->nfiles && !f; i++)
                if (strcmp(names[i], fn) == 0) f = c->files[i];
            if (!f || !mf_st_find(f, key)) {
                rc = mf_fail(err, MF_EFORMAT, "%s/%s: tensor %s listed in the index is missing from the file", dir, fn,
                             key);
                goto done;
            }
        }
    }
done:
    free(names);
    json_decref(root);
    if (rc) mf_checkpoint_close(c);
    else *out = c;
    return rc;
}

const mf_st_tensor *mf_checkpoint_find(const mf_checkpoint *c, const char *name) {
    for (size_t i = 0; i < c->nfiles; i++) {
        const mf_st_tensor *t = mf_st_find(c->files[i], name);
        if (t) return t;
    }
    return NULL;
}
