/* The safetensors reader on files built byte by byte here, and the writer
 * read back by the reader. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "mf_models.h"
#include "testutil.h"

/* Writes an 8-byte little-endian header length, the header, then data. */
static const char *write_raw(const char *header, const void *data, size_t n, long declared_len) {
    static char path[4200];
    snprintf(path, sizeof path, "%s/t.safetensors", temp_dir());
    FILE *fp = fopen(path, "wb");
    uint64_t len = declared_len >= 0 ? (uint64_t)declared_len : strlen(header);
    for (int i = 0; i < 8; i++) fputc((int)(len >> (8 * i)) & 0xff, fp);
    fputs(header, fp);
    if (n) fwrite(data, 1, n, fp);
    fclose(fp);
    return path;
}

Test(safetensors, reads_a_hand_built_file) {
    float v[3] = {1.0f, -2.5f, 0.125f};
    uint16_t b[2] = {0x3f80, 0xc000};   /* bf16 1.0, -2.0 */
    uint8_t data[16];
    memcpy(data, v, 12);
    memcpy(data + 12, b, 4);
    const char *p = write_raw("{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[12,16]},"
                              "\"a\":{\"dtype\":\"F32\",\"shape\":[1,3],\"data_offsets\":[0,12]}}",
                              data, 16, -1);
    mf_st_file *f;
    mf_error err = {0};
    cr_assert_eq(mf_st_open(&f, p, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(f->count, 2);
    const mf_st_tensor *a = mf_st_find(f, "a"), *bt = mf_st_find(f, "b");
    cr_assert(a && bt && !mf_st_find(f, "c"));
    cr_assert_eq(a->ndim, 2);
    cr_assert_eq(a->shape[1], 3);
    cr_assert_eq(mf_load_as_f64(a->data, a->dtype, 1), -2.5);
    cr_assert_eq(mf_load_as_f64(bt->data, bt->dtype, 1), -2.0);
    cr_assert(f->metadata_json && strstr(f->metadata_json, "\"pt\""));
    mf_st_close(f);
}

static void expect_bad(const char *header, size_t ndata, long declared, const char *needle) {
    uint8_t data[64] = {0};
    const char *p = write_raw(header, data, ndata, declared);
    mf_st_file *f;
    mf_error err = {0};
    cr_assert_eq(mf_st_open(&f, p, &err), MF_EFORMAT, "header %s was accepted", header);
    cr_assert(strstr(err.msg, needle), "message \"%s\" lacks \"%s\"", err.msg, needle);
    cr_assert(strstr(err.msg, "t.safetensors"), "message names the file: %s", err.msg);
}

Test(safetensors, rejects_malformed_headers) {
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, -1, "outside");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, -1, "elements");
    expect_bad("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -1, "dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, -1, "shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, -1, "after the last tensor");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, -1, "JSON");
    expect_bad("[1,2]", 0, -1, "JSON object");
    expect_bad("{}", 0, 1000, "past the end");
}

Test(safetensors, writer_round_trip) {
    mf_st_writer *w = mf_st_writer_new();
    int64_t s1[2] = {2, 2}, s2[1] = {3};
    double d[4] = {1, 2, 3, 4};
    int32_t t[3] = {7, -1, 5};
    mf_st_writer_add(w, "x/d", MF_F64, 2, s1, d);
    mf_st_writer_add(w, "x/t", MF_I32, 1, s2, t);
    mf_st_writer_meta(w, "k", "v");
    char path[4200];
    snprintf(path, sizeof path, "%s/w.safetensors", temp_dir());
    mf_error err = {0};
    cr_assert_eq(mf_st_writer_write(w, path, &err), MF_OK, "%s", err.msg);
    mf_st_writer_free(w);
    mf_st_file *f;
    cr_assert_eq(mf_st_open(&f, path, &err), MF_OK, "%s", err.msg);
    const mf_st_tensor *x = mf_st_find(f, "x/d");
    cr_assert_eq(mf_load_as_f64(x->data, MF_F64, 3), 4.0);
    cr_assert_eq(((uintptr_t)x->data - (uintptr_t)f->map.data) % 8, 0, "data is 8-byte aligned");
    const mf_st_tensor *ti = mf_st_find(f, "x/t");
    int32_t v;
    memcpy(&v, ti->data + 4, 4);
    cr_assert_eq(v, -1);
    mf_st_close(f);
}
