/* The moeflip command: each subcommand parses its arguments and calls the
 * library. Exit status: 0 success, 1 failure (one line on stderr), 2 usage. */
#ifndef MF_CLI_H
#define MF_CLI_H

#include "mf_core.h"

#define EXIT_USAGE 2

int cmd_trace(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_mma(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_heatmap(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_sweep(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_push(int argc, char **argv);

/* Prints "moeflip: <message>" and returns 1. */
int cli_fail(const mf_error *err);
/* Prints "moeflip: <what>: writing to standard output failed: <errno's reason>" and returns 1. */
int cli_stdout_error(const char *what);
/* Prints "moeflip <cmd>: <message>", the usage hint, and returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses a positive int option value; false if malformed. */
bool cli_parse_int(const char *s, long min, long max, long *out);

#endif
