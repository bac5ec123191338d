/* moeflip serve: the collector service. */
#include "cli.h"
#include "mf_serve.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char *help =
    "usage: moeflip serve --root DIR [--listen 127.0.0.1:8750] [--token-file F] [--read-token-file F]\n"
    "                     [--max-run-bytes N] [--max-uploads N] [--max-connections N]\n"
    "                     [--header-timeout MS] [--idle-timeout MS] [--bootstrap N] [--quiet]\n"
    "\n"
    "Keeps runs pushed with `moeflip push` under DIR (verified, renamed into place whole), computes diffs\n"
    "of them on request and serves diff.json, heatmaps, report.html and a web UI at /. Uploads need the\n"
    "bearer token in --token-file (a file only its owner may read; without it no uploads are taken);\n"
    "--read-token-file makes reads need a token too. Listens on loopback unless --listen says otherwise\n"
    "(port 0: any free port; the first line on stdout names it). Limits: uploads larger than\n"
    "--max-run-bytes [8 GiB] get 413, more than --max-uploads [8] at once get 429; requests whose headers\n"
    "take longer than --header-timeout [10000 ms] or that stall longer than --idle-timeout [30000 ms] are\n"
    "closed, and so is a kept-alive connection idle that long. Diffs use --bootstrap [1000] resamples\n"
    "unless a request asks otherwise. SIGINT or SIGTERM stops it; uploads under way are dropped, stored\n"
    "runs are never partial.\n";

int cmd_serve(int argc, char **argv) {
    mf_serve_opts o;
    mf_serve_opts_default(&o);
    static const struct option opts[] = {
        {"root", required_argument, 0, 'r'},          {"listen", required_argument, 0, 'l'},
        {"token-file", required_argument, 0, 't'},    {"read-token-file", required_argument, 0, 'R'},
        {"max-run-bytes", required_argument, 0, 'm'}, {"max-uploads", required_argument, 0, 'u'},
        {"max-connections", required_argument, 0, 'c'}, {"header-timeout", required_argument, 0, 'H'},
        {"idle-timeout", required_argument, 0, 'I'},  {"bootstrap", required_argument, 0, 'b'},
        {"quiet", no_argument, 0, 'q'},               {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c;
    long v;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        switch (c) {
        case 'r': o.root = optarg; break;
        case 'l': o.listen = optarg; break;
        case 't': o.token_file = optarg; break;
        case 'R': o.read_token_file = optarg; break;
        case 'm':
            if (!cli_parse_int(optarg, 1, 0x7fffffffffffffffL, &v)) return cli_usage_error("serve", "--max-run-bytes takes a byte count");
            o.max_run_bytes = (uint64_t)v;
            break;
        case 'u':
            if (!cli_parse_int(optarg, 1, 100000, &v)) return cli_usage_error("serve", "--max-uploads takes a positive count");
            o.max_uploads = (int)v;
            break;
        case 'c':
            if (!cli_parse_int(optarg, 1, 1000000, &v)) return cli_usage_error("serve", "--max-connections takes a positive count");
            o.max_connections = (int)v;
            break;
        case 'H':
            if (!cli_parse_int(optarg, 1, 86400000, &v)) return cli_usage_error("serve", "--header-timeout takes milliseconds");
            o.header_timeout_ms = (int)v;
            break;
        case 'I':
            if (!cli_parse_int(optarg, 1, 86400000, &v)) return cli_usage_error("serve", "--idle-timeout takes milliseconds");
            o.idle_timeout_ms = (int)v;
            break;
        case 'b':
            if (!cli_parse_int(optarg, 0, 10000, &v)) return cli_usage_error("serve", "--bootstrap takes 0 to 10000");
            o.diff_bootstrap = (int)v;
            break;
        case 'q': o.quiet = true; break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("serve", "unknown or incomplete option %s", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage_error("serve", "unexpected argument %s", argv[optind]);
    if (!o.root) return cli_usage_error("serve", "give --root DIR");
    mf_error err = {0};
    if (mf_serve(&o, &err)) return cli_fail(&err);
    return 0;
}
