/* Status codes and one-line error messages. */
#include "mf_core.h"

#include <stdarg.h>
#include <string.h>

int mf_fail(mf_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int mf_fail_wrap(mf_error *err, const char *fmt, ...) {
    if (!err) return MF_EINVAL;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3, m = strlen(old);
    if (m > room) m = room;
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = 0;
    return err->code ? err->code : MF_EINVAL;
}

const char *mf_strerror(int code) {
    switch (code) {
    case MF_OK: return "ok";
    case MF_EINVAL: return "invalid input";
    case MF_EIO: return "i/o error";
    case MF_EFORMAT: return "malformed file";
    case MF_ENOMEM: return "out of memory";
    case MF_EUNSUPPORTED: return "unsupported";
    case MF_EDIGEST: return "digest mismatch";
    case MF_EMISMATCH: return "mismatch";
    default: return "unknown error";
    }
}
