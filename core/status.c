/* Status codes and one-line error messages. */
#include "mf_core.h"

#include <stdarg.h>
#include <string.h>

int mf_utf8_char(const unsigned char *p, size_t n) {
    if (n == 0) return 0;
    const unsigned char c = p[0];
    if (c < 0x80) return 1;
    const int len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!len || c == 0xc0 || c == 0xc1 || c > 0xf4 || (size_t)len > n) return 0;
    for (int i = 1; i < len; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    if (c == 0xe0 && p[1] < 0xa0) return 0;   /* overlong */
    if (c == 0xed && p[1] >= 0xa0) return 0;  /* surrogates */
    if (c == 0xf0 && p[1] < 0x90) return 0;   /* overlong */
    if (c == 0xf4 && p[1] >= 0x90) return 0;  /* past U+10FFFF */
    return len;
}

void mf_utf8_scrub(char *s) {
    unsigned char *p = (unsigned char *)s;
    size_t n = strlen(s);
    while (n) {
        const int len = mf_utf8_char(p, n);
        if (!len) {
            *p = '?';
            p++;
            n--;
        } else {
            p += len;
            n -= (size_t)len;
        }
    }
}

size_t mf_utf8_length(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), chars = 0;
    while (n) {
        const int len = mf_utf8_char(p, n);
        const size_t step = len ? (size_t)len : 1;
        p += step;
        n -= step;
        chars++;
    }
    return chars;
}

/* A message cut by the buffer's size loses what is left of a character split at the end, and bytes that are
 * not UTF-8 (read from a file) or control characters (a line break a parser quoted from its input) become '?':
 * every message is one line of valid UTF-8. */
static void tidy(char *msg) {
    for (char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    size_t len = strlen(msg), start = len;
    while (start > 0 && len - start < 3 && ((unsigned char)msg[start - 1] & 0xc0) == 0x80) start--;
    if (start > 0 && (unsigned char)msg[start - 1] >= 0xc0 &&
        mf_utf8_char((const unsigned char *)msg + start - 1, len - start + 1) == 0)
        msg[start - 1] = 0;
    mf_utf8_scrub(msg);
}

int mf_fail(mf_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        tidy(err->msg);
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
    tidy(err->msg);
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
