/* moeflip push: send a run to a moeflip serve. */
#include "cli.h"
#include "mf_serve.h"

#include <getopt.h>
#include <string.h>
#include <unistd.h>

static const char *help =
    "usage: moeflip push RUN --to URL [--token-file F] [--name NAME] [--retries N] [--stall-timeout S] [-q]\n"
    "\n"
    "Streams the run directory RUN (verified here first) to the moeflip serve at URL (http://HOST:PORT)\n"
    "as NAME (default: RUN's base name). Connection failures, timeouts and busy or failing servers\n"
    "(408, 429, 5xx) are retried up to --retries [5] times with backoff, and so is an attempt whose body\n"
    "moves no byte for --stall-timeout [60] s; once the whole run is sent, the server's answer is awaited\n"
    "up to 10 minutes (it verifies and fsyncs the run first). Exits 0 only when the server\n"
    "has verified the run's manifest and every shard digest and stored it (pushing the same run again is\n"
    "harmless). --token-file holds the server's bearer token (a file only its owner may read). A progress\n"
    "bar is drawn on a terminal.\n";

int cmd_push(int argc, char **argv) {
    mf_push_opts o = {.retries = 5, .progress = true};
    static const struct option opts[] = {{"to", required_argument, 0, 't'},      {"token-file", required_argument, 0, 'k'},
                                         {"name", required_argument, 0, 'n'},    {"retries", required_argument, 0, 'r'},
                                         {"stall-timeout", required_argument, 0, 's'},
                                         {"quiet", no_argument, 0, 'q'},         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    long v;
    bool quiet = false;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        switch (c) {
        case 't': o.url = optarg; break;
        case 'k': o.token_file = optarg; break;
        case 'n': o.name = optarg; break;
        case 'r':
            if (!cli_parse_int(optarg, 0, 100, &v)) return cli_usage_error("push", "--retries takes 0 to 100");
            o.retries = (int)v;
            break;
        case 's':
            if (!cli_parse_int(optarg, 1, 3600, &v)) return cli_usage_error("push", "--stall-timeout takes 1 to 3600 seconds");
            o.stall_s = (int)v;
            break;
        case 'q': quiet = true; break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("push", "unknown or incomplete option %s", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) return cli_usage_error("push", "give one run directory");
    if (!o.url) return cli_usage_error("push", "give --to URL");
    o.run_dir = argv[optind];
    o.progress = !quiet;
    mf_push_result r;
    mf_error err = {0};
    /* the client is a module: libcurl is loaded by this command only */
    int (*push)(const mf_push_opts *, mf_push_result *, mf_error *);
    void *module;
    const mf_module_fn fns[] = {{"mf_push", (void **)&push}};
    if (mf_module_load(&module, "libmoeflip_push.so", fns, 1, &err)) {
        mf_fail_wrap(&err, "cannot load the push client");
        return cli_fail(&err);
    }
    if (push(&o, &r, &err)) return cli_fail(&err);
    if (!quiet)
        printf("pushed %s to %s: %.1f MB in %.3f s (%.0f MB/s), verified by the server%s%s\n", r.name, o.url, (double)r.bytes / 1e6,
               r.seconds, r.seconds > 0 ? (double)r.bytes / 1e6 / r.seconds : 0.0,
               r.existed ? " (it already held this run)" : "", r.attempts > 1 ? " after retries" : "");
    return 0;
}
