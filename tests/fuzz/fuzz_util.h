/* Shared by the libFuzzer targets of tests/fuzz: inputs as files (the readers
 * take paths), a scratch directory per process, and the invariant every
 * refusal must keep: one message, valid UTF-8 (so that it can go into JSON),
 * naming something. A target aborts when an invariant breaks; the sanitizers
 * abort on memory and undefined-behaviour errors. */
#ifndef MF_FUZZ_UTIL_H
#define MF_FUZZ_UTIL_H

#include "mf_core.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A scratch directory for this process, removed at exit (its files, not below). */
static char fuzz_dir[128];

static inline void fuzz_cleanup(void) {
    if (!fuzz_dir[0]) return;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir);
    if (system(cmd)) { /* best effort */ }
}

static inline const char *fuzz_scratch(void) {
    if (!fuzz_dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(fuzz_dir, sizeof fuzz_dir, "%s/moeflip-fuzz-XXXXXX", base);
        if (!mkdtemp(fuzz_dir)) abort();
        atexit(fuzz_cleanup);
    }
    return fuzz_dir;
}

/* Removes the files of dir (one level, as runs are) and dir itself, without a shell. */
static inline void fuzz_remove_flat(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

/* Writes n bytes to path (replacing it). */
static inline void fuzz_write(const char *path, const void *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) abort();
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) abort();
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

/* A refusal: a code, and one non-empty line of valid UTF-8. */
static inline void fuzz_check_refusal(int rc, const mf_error *e) {
    if (rc == MF_OK) return;
    const size_t n = strlen(e->msg);
    if (n == 0 || n >= sizeof e->msg || strchr(e->msg, '\n')) {
        fprintf(stderr, "fuzz: refusal %d without one line of message: [%s]\n", rc, e->msg);
        abort();
    }
    for (size_t i = 0; i < n;) {
        const int len = mf_utf8_char((const unsigned char *)e->msg + i, n - i);
        if (!len) {
            fprintf(stderr, "fuzz: message is not UTF-8 at byte %zu: %s\n", i, e->msg);
            abort();
        }
        i += (size_t)len;
    }
}

#endif
