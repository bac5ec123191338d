/* moeflip tokenize: texts to token ids (the prompt files of trace) with a Hugging Face tokenizer.json, or ids
 * back to texts with --decode. */
#include "cli.h"
#include "mf_rundir.h"

#include <getopt.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *help =
    "usage: moeflip tokenize (--tokenizer FILE.json | --model DIR) --input TEXTS.jsonl [-o TOKENS.jsonl]\n"
    "       moeflip tokenize (--tokenizer FILE.json | --model DIR) --decode --input TOKENS.jsonl [-o TEXTS.jsonl]\n"
    "\n"
    "Encodes every line {\"id\": ..., \"text\": ...} of TEXTS.jsonl into {\"id\": ..., \"tokens\": [...]} (the prompt\n"
    "files of moeflip trace), with exactly the ids Hugging Face tokenizers' Tokenizer.encode(text) gives with that\n"
    "tokenizer.json: its normalizer, pre-tokenizer, BPE model, added and special tokens and post-processor.\n"
    "A component it does not implement is refused, by name. Every text is encoded before anything is written.\n"
    "\n"
    "  --tokenizer FILE     a tokenizer.json\n"
    "  --model DIR          a checkpoint directory: its tokenizer.json\n"
    "  --input FILE         JSON lines: {\"id\", \"text\"} (with --decode: {\"id\", \"tokens\"})\n"
    "  -o, --output FILE    where to write (replaced whole when complete)   [standard output]\n"
    "  --no-special         no special tokens from the post-processor (add_special_tokens=False)\n"
    "  --decode             ids to texts, through the file's decoder (Tokenizer.decode)\n"
    "  --skip-special       with --decode: leave special tokens out (skip_special_tokens=True)\n";

/* s as a JSON string (bytes that are not UTF-8, which no decoder makes, shown as '?') */
static void put_json_string(mf_buf *b, const char *s, size_t n) {
    char *t = mf_xmalloc(n + 1);
    for (size_t i = 0; i < n;) {
        const int len = (unsigned char)s[i] < 0x80 ? 1 : mf_utf8_char((const unsigned char *)s + i, n - i);
        if (len) memcpy(t + i, s + i, (size_t)len), i += (size_t)len;
        else t[i++] = '?';
    }
    json_t *j = json_stringn_nocheck(t, n);
    free(t);
    char *d = json_dumps(j, JSON_ENCODE_ANY);
    mf_buf_put(b, d, strlen(d));
    free(d);
    json_decref(j);
}

static int write_out(const char *out_path, const mf_buf *b, mf_error *err) {
    if (out_path) return mf_write_file_atomic(out_path, b->s ? b->s : "", b->n, err) ? 1 : 0;
    if ((b->n && fwrite(b->s, 1, b->n, stdout) != b->n) || fflush(stdout) != 0 || ferror(stdout)) return -1;
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *tok_file = NULL, *model_dir = NULL, *input = NULL, *out_path = NULL;
    bool no_special = false, decode = false, skip_special = false;
    static const struct option opts[] = {
        {"tokenizer", required_argument, 0, 't'}, {"model", required_argument, 0, 'm'},
        {"input", required_argument, 0, 'i'},     {"output", required_argument, 0, 'o'},
        {"no-special", no_argument, 0, 'N'},      {"decode", no_argument, 0, 'D'},
        {"skip-special", no_argument, 0, 'S'},    {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "t:m:i:o:h", opts, NULL)) != -1) {
        switch (c) {
        case 't': tok_file = optarg; break;
        case 'm': model_dir = optarg; break;
        case 'i': input = optarg; break;
        case 'o': out_path = optarg; break;
        case 'N': no_special = true; break;
        case 'D': decode = true; break;
        case 'S': skip_special = true; break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("tokenize", "unknown or incomplete option %s", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage_error("tokenize", "unexpected argument %s", argv[optind]);
    if (!tok_file == !model_dir) return cli_usage_error("tokenize", "give one of --tokenizer FILE.json and --model DIR");
    if (!input) return cli_usage_error("tokenize", "--input is required");
    if (decode && no_special) return cli_usage_error("tokenize", "--no-special is for encoding (with --decode: --skip-special)");
    if (!decode && skip_special) return cli_usage_error("tokenize", "--skip-special goes with --decode");
    char path[4200];
    if (model_dir) {
        if (!mf_path_join(path, sizeof path, model_dir, "tokenizer.json"))
            return cli_usage_error("tokenize", "--model: path too long");
        tok_file = path;
    }
    mf_error err = {0};
    mf_tokenizer *tok;
    if (mf_tokenizer_load(&tok, tok_file, &err)) return cli_fail(&err);
    mf_buf b = {0};
    int rc = 0;
    if (!decode) {
        mf_texts texts;
        if (mf_texts_load(&texts, input, &err)) {
            mf_tokenizer_free(tok);
            return cli_fail(&err);
        }
        for (size_t i = 0; i < texts.n && !rc; i++) {
            int32_t *ids;
            size_t n;
            if (mf_tokenizer_encode(tok, texts.v[i].text, texts.v[i].len, !no_special, &ids, &n, &err)) {
                mf_fail_wrap(&err, "%s: sequence %s", input, texts.v[i].id);
                rc = 1;
                break;
            }
            mf_buf_put(&b, "{\"id\": ", 7);
            put_json_string(&b, texts.v[i].id, strlen(texts.v[i].id));
            mf_buf_put(&b, ", \"tokens\": [", 13);
            for (size_t k = 0; k < n; k++) {
                char num[16];
                const int l = snprintf(num, sizeof num, k ? ", %d" : "%d", ids[k]);
                mf_buf_put(&b, num, (size_t)l);
            }
            mf_buf_put(&b, "]}\n", 3);
            free(ids);
        }
        mf_texts_free(&texts);
    } else {
        mf_prompts ps;
        if (mf_prompts_load(&ps, input, INT32_MAX, &err)) {
            mf_tokenizer_free(tok);
            return cli_fail(&err);
        }
        for (size_t i = 0; i < ps.n && !rc; i++) {
            char *text;
            size_t len;
            if (mf_tokenizer_decode_text(tok, ps.seq[i].tokens, (size_t)ps.seq[i].T, skip_special, &text, &len, &err)) {
                mf_fail_wrap(&err, "%s: sequence %s", input, ps.seq[i].id);
                rc = 1;
                break;
            }
            mf_buf_put(&b, "{\"id\": ", 7);
            put_json_string(&b, ps.seq[i].id, strlen(ps.seq[i].id));
            mf_buf_put(&b, ", \"text\": ", 10);
            put_json_string(&b, text, len);
            mf_buf_put(&b, "}\n", 2);
            free(text);
        }
        mf_prompts_free(&ps);
    }
    mf_tokenizer_free(tok);
    if (!rc) {
        const int w = write_out(out_path, &b, &err);
        free(b.s);
        if (w < 0) return cli_stdout_error("tokenize");
        return w ? cli_fail(&err) : 0;
    }
    free(b.s);
    return cli_fail(&err);
}
