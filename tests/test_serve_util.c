#include "test_serve_util.h"
#include "mf_trace.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <http_parser.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <unistd.h>

const char *token_file(const char *dir) {
    static char p[8][600];
    static int next;
    char *path = p[next++ % 8];
    snprintf(path, 600, "%s/token", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, TEST_TOKEN "\n", strlen(TEST_TOKEN) + 1), (ssize_t)strlen(TEST_TOKEN) + 1);
    close(fd);
    chmod(path, 0600);
    return path;
}

void server_start(test_server *s, const char *root, const char *extra) {
    signal(SIGPIPE, SIG_IGN);
    memset(s, 0, sizeof *s);
    snprintf(s->root, sizeof s->root, "%s", root);
    static int nth;
    snprintf(s->err_path, sizeof s->err_path, "%s.serve-%d.err", root, nth++);
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec %s serve --root '%s' --listen 127.0.0.1:0 %s 2>'%s'", MF_TEST_BIN, root, extra ? extra : "",
             s->err_path);
    const pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        /* a test that fails half-way must not leave its server running */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    s->pid = pid;
    char line[1024];
    size_t n = 0;
    struct pollfd pf = {fds[0], POLLIN, 0};
    while (n < sizeof line - 1 && !memchr(line, '\n', n)) {
        cr_assert(poll(&pf, 1, 60000) > 0, "the server printed nothing for 60 s");
        ssize_t r = read(fds[0], line + n, sizeof line - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
        line[n] = 0;
    }
    line[n] = 0;
    close(fds[0]);
    const char *p = strstr(line, "http://127.0.0.1:");
    cr_assert(p, "the server did not say where it listens: \"%s\"", line);
    s->port = atoi(p + strlen("http://127.0.0.1:"));
    cr_assert_gt(s->port, 0);
}

void server_start_in(test_server *s, const char *dir, const char *more, char root[600], char extra[700]) {
    snprintf(root, 600, "%s/root", dir);
    snprintf(extra, 700, "--token-file '%s' %s", token_file(dir), more);
    server_start(s, root, extra);
}

bool server_alive(test_server *s) {
    int st;
    return s->pid > 0 && waitpid(s->pid, &st, WNOHANG) == 0;
}

int server_stop(test_server *s, int sig) {
    int st = -1;
    if (s->pid <= 0) return st;
    kill(s->pid, sig);
    waitpid(s->pid, &st, 0);
    s->pid = 0;
    /* under the sanitizers the server reports any fault on stderr (and a leak when it exits) */
    char *log = NULL;
    size_t n;
    mf_error e = {0};
    if (mf_read_file(s->err_path, &log, &n, &e) == MF_OK) {
        cr_assert_null(strstr(log, "Sanitizer"), "the server reported: %s", log);
        cr_assert_null(strstr(log, "runtime error:"), "the server reported: %s", log);
        free(log);
    }
    return st;
}

int http_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

bool send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

/* Responses are parsed with http-parser too (HTTP_RESPONSE): status, headers as text, body. */
typedef struct reader {
    http_resp *r;
    size_t head_len, cap;
    bool in_value, done;
} reader;

static void head_append(reader *rd, const char *at, size_t len) {
    http_resp *r = rd->r;
    size_t room = sizeof r->head - 1 - rd->head_len;
    size_t n = len < room ? len : room;
    memcpy(r->head + rd->head_len, at, n);
    rd->head_len += n;
    r->head[rd->head_len] = 0;
}

static int rd_field(http_parser *p, const char *at, size_t len) {
    reader *rd = p->data;
    if (rd->in_value || rd->head_len == 0) head_append(rd, "\r\n", 2);
    rd->in_value = false;
    head_append(rd, at, len);
    return 0;
}

static int rd_value(http_parser *p, const char *at, size_t len) {
    reader *rd = p->data;
    if (!rd->in_value) head_append(rd, ": ", 2);
    rd->in_value = true;
    head_append(rd, at, len);
    return 0;
}

static int rd_body(http_parser *p, const char *at, size_t len) {
    reader *rd = p->data;
    http_resp *r = rd->r;
    if (r->body_len + len + 1 > rd->cap) {
        rd->cap = (r->body_len + len + 1) * 2;
        r->body = realloc(r->body, rd->cap);
    }
    memcpy(r->body + r->body_len, at, len);
    r->body_len += len;
    r->body[r->body_len] = 0;
    return 0;
}

static int rd_complete(http_parser *p) {
    reader *rd = p->data;
    if (p->status_code == 100) {   /* a 100 Continue comes before the answer */
        rd->head_len = 0;
        rd->r->head[0] = 0;
        rd->in_value = false;
        return 0;
    }
    rd->r->status = (int)p->status_code;
    rd->done = true;
    http_parser_pause(p, 1);
    return 0;
}

void http_read(int fd, http_resp *r) {
    memset(r, 0, sizeof *r);
    r->body = calloc(1, 1);
    reader rd = {.r = r, .cap = 1};
    http_parser p;
    http_parser_init(&p, HTTP_RESPONSE);
    p.data = &rd;
    http_parser_settings st;
    http_parser_settings_init(&st);
    st.on_header_field = rd_field;
    st.on_header_value = rd_value;
    st.on_body = rd_body;
    st.on_message_complete = rd_complete;
    char buf[65536];
    while (!rd.done) {
        ssize_t got = recv(fd, buf, sizeof buf, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            http_parser_execute(&p, &st, NULL, 0);   /* the end of a response without a length */
            break;
        }
        size_t used = http_parser_execute(&p, &st, buf, (size_t)got);
        if (HTTP_PARSER_ERRNO(&p) != HPE_OK && HTTP_PARSER_ERRNO(&p) != HPE_PAUSED) break;
        (void)used;
    }
    if (rd.done || r->status) {
        /* the status line first, as the server wrote it */
        char line[64];
        const size_t n = (size_t)snprintf(line, sizeof line, "HTTP/1.1 %d", r->status);
        size_t hl = strlen(r->head);
        if (hl + n >= sizeof r->head) hl = sizeof r->head - 1 - n;
        memmove(r->head + n, r->head, hl);
        memcpy(r->head, line, n);
        r->head[n + hl] = 0;
    } else {
        r->status = 0;
        r->body_len = 0;
        r->body[0] = 0;
    }
}

void http_request(int port, const char *method, const char *path, const char *headers, const void *body, size_t len,
                  http_resp *r) {
    int fd = http_connect(port);
    cr_assert(fd >= 0, "cannot connect to port %d", port);
    char head[4096];
    int hl = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n",
                      method, path, headers ? headers : "", len);
    bool ok = send_all(fd, head, (size_t)hl);
    if (ok && len) send_all(fd, body, len);
    http_read(fd, r);
    close(fd);
}

void http_free(http_resp *r) {
    free(r->body);
    r->body = NULL;
}

char *run_body(const char *dir, size_t *len) {
    char p[4200], *man;
    size_t ml;
    mf_error e = {0};
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    cr_assert_eq(mf_read_file(p, &man, &ml, &e), MF_OK, "%s", e.msg);
    json_t *j = json_loads(man, 0, NULL), *shards = json_object_get(j, "shards");
    size_t cap = ml + 4096;
    for (size_t i = 0; i < json_array_size(shards); i++) cap += (size_t)json_integer_value(json_object_get(json_array_get(shards, i), "bytes")) + 128;
    char *b = malloc(cap);
    size_t n = (size_t)sprintf(b, "moeflip-run 1\nfile %zu manifest.json\n", ml);
    memcpy(b + n, man, ml);
    n += ml;
    for (size_t i = 0; i < json_array_size(shards); i++) {
        const char *f = json_string_value(json_object_get(json_array_get(shards, i), "file"));
        char *data;
        size_t dl;
        snprintf(p, sizeof p, "%s/%s", dir, f);
        cr_assert_eq(mf_read_file(p, &data, &dl, &e), MF_OK, "%s", e.msg);
        n += (size_t)sprintf(b + n, "file %zu %s\n", dl, f);
        memcpy(b + n, data, dl);
        n += dl;
        free(data);
    }
    n += (size_t)sprintf(b + n, "end\n");
    json_decref(j);
    free(man);
    *len = n;
    return b;
}

void name_hex(const char *name, char *out) {
    static const char hx[] = "0123456789abcdef";
    size_t i = 0;
    for (; name[i]; i++) {
        out[2 * i] = hx[(unsigned char)name[i] >> 4];
        out[2 * i + 1] = hx[(unsigned char)name[i] & 15];
    }
    out[2 * i] = 0;
}

static int cmpstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

char *list_names(int port, const char *auth_header) {
    http_resp r;
    http_request(port, "GET", "/api/runs", auth_header, NULL, 0, &r);
    cr_assert_eq(r.status, 200, "list: %d %s", r.status, r.body);
    json_t *j = json_loads(r.body, 0, NULL), *runs = json_object_get(j, "runs");
    cr_assert(json_is_array(runs), "list: %s", r.body);
    size_t n = json_array_size(runs);
    char **names = calloc(n + 1, sizeof *names);
    size_t total = 1;
    for (size_t i = 0; i < n; i++) {
        names[i] = strdup(json_string_value(json_object_get(json_array_get(runs, i), "name")));
        total += strlen(names[i]) + 1;
    }
    qsort(names, n, sizeof *names, cmpstr);
    char *out = calloc(total, 1);
    for (size_t i = 0; i < n; i++) {
        if (i) strcat(out, ",");
        strcat(out, names[i]);
        free(names[i]);
    }
    free(names);
    json_decref(j);
    http_free(&r);
    return out;
}

void put_run(int port, const char *name, const char *dir, const char *headers, http_resp *r) {
    size_t len;
    char *body = run_body(dir, &len), path[256];
    snprintf(path, sizeof path, "/api/runs/%s", name);
    http_request(port, "PUT", path, headers, body, len, r);
    free(body);
}

int open_upload(int port, const char *name, const char *body, size_t len, size_t send_n) {
    int fd = http_connect(port);
    cr_assert(fd >= 0);
    char head[512];
    int hl = snprintf(head, sizeof head, "PUT /api/runs/%s HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: %zu\r\n\r\n", name, len);
    cr_assert(send_all(fd, head, (size_t)hl));
    if (send_n) cr_assert(send_all(fd, body, send_n));
    return fd;
}

void assert_stored_verifies(const char *root, const char *name, const char *orig_dir) {
    char hex[200], dir[1024], a[1200], b[1200];
    name_hex(name, hex);
    snprintf(dir, sizeof dir, "%s/runs/%s", root, hex);
    mf_run *r;
    mf_error e = {0};
    cr_assert_eq(mf_run_open(&r, dir, &e), MF_OK, "stored run %s does not verify: %s", name, e.msg);
    mf_run_close(r);
    snprintf(a, sizeof a, "%s/manifest.json", dir);
    snprintf(b, sizeof b, "%s/manifest.json", orig_dir);
    size_t xl, yl;
    char *x = slurp(a, &xl), *y = slurp(b, &yl);
    cr_assert(xl == yl && !memcmp(x, y, xl), "stored manifest of %s differs from the pushed one", name);
    free(x);
    free(y);
}
