/* serve/'s helpers, below both the store and the connection code: the log line, hex names, and the token
 * comparison. */
#include "serve_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void server_log(server *s, const char *fmt, ...) {
    if (s->o.quiet) return;
    char line[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "moeflip serve: %s\n", line);
}

/* Compares a presented token with the secret in time that depends on neither:
 * both are padded into fixed buffers and every byte is looked at. */
bool ct_token_equal(const char *given, size_t given_len, const char *secret) {
    unsigned char a[MF_SERVE_TOKEN_MAX + 1] = {0}, b[MF_SERVE_TOKEN_MAX + 1] = {0};
    size_t slen = strlen(secret);
    size_t gl = given_len > MF_SERVE_TOKEN_MAX ? MF_SERVE_TOKEN_MAX : given_len;
    memcpy(a, given, gl);
    memcpy(b, secret, slen);
    volatile unsigned char d = (unsigned char)((given_len != slen) | (given_len > MF_SERVE_TOKEN_MAX));
    for (size_t i = 0; i < sizeof a; i++) d |= (unsigned char)(a[i] ^ b[i]);
    explicit_bzero(a, sizeof a);
    explicit_bzero(b, sizeof b);
    return d == 0;
}

void hex_encode(const void *data, size_t n, char *out) {
    static const char hx[] = "0123456789abcdef";
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[p[i] >> 4];
        out[2 * i + 1] = hx[p[i] & 15];
    }
    out[2 * n] = 0;
}
