/*
 * moatjs: Moat's JavaScript guest for the wasm tier. A small command line
 * around QuickJS (Debian's quickjs source package) for wasm32-wasi, without
 * quickjs-libc (which needs threads, signals and a terminal WASI lacks).
 *
 *   qjs -e CODE [ARG...]   evaluate CODE
 *   qjs FILE [ARG...]      evaluate the file FILE
 *
 * Globals: print(...) and console.log/info/debug (stdout), console.error/warn
 * (stderr), scriptArgs (the ARGs), readFile(path) -> string and
 * writeFile(path, string) for files the guest can reach (only the
 * directories the host preopened). An uncaught exception prints to stderr
 * and exits 1.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "quickjs.h"

static void write_args(JSContext *ctx, FILE *f, int argc, JSValueConst *argv) {
	for (int i = 0; i < argc; i++) {
		size_t len;
		const char *s = JS_ToCStringLen(ctx, &len, argv[i]);
		if (i > 0) fputc(' ', f);
		if (s) { fwrite(s, 1, len, f); JS_FreeCString(ctx, s); }
	}
	fputc('\n', f);
	fflush(f);
}

static JSValue js_stdout(JSContext *ctx, JSValueConst this, int argc, JSValueConst *argv) {
	(void) this; write_args(ctx, stdout, argc, argv); return JS_UNDEFINED;
}

static JSValue js_stderr(JSContext *ctx, JSValueConst this, int argc, JSValueConst *argv) {
	(void) this; write_args(ctx, stderr, argc, argv); return JS_UNDEFINED;
}

/* read_file reads a whole file into a malloc'd buffer; NULL and errno set on failure. */
static char *read_file(const char *path, size_t *len) {
	FILE *f = fopen(path, "rb");
	if (!f) return NULL;
	size_t cap = 65536, n = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (!buf) { fclose(f); errno = ENOMEM; return NULL; }
		size_t r = fread(buf + n, 1, cap - n, f);
		n += r;
		if (r == 0) break;
		if (n == cap) { cap *= 2; buf = realloc(buf, cap); }
	}
	int bad = ferror(f);
	fclose(f);
	if (bad) { free(buf); errno = EIO; return NULL; }
	*len = n;
	return buf;
}

static JSValue throw_errno(JSContext *ctx, const char *op, const char *path) {
	return JS_ThrowInternalError(ctx, "%s %s: %s", op, path, strerror(errno));
}

static JSValue js_read_file(JSContext *ctx, JSValueConst this, int argc, JSValueConst *argv) {
	(void) this;
	if (argc < 1) return JS_ThrowTypeError(ctx, "readFile(path)");
	const char *path = JS_ToCString(ctx, argv[0]);
	if (!path) return JS_EXCEPTION;
	size_t len = 0;
	char *buf = read_file(path, &len);
	if (!buf) { JSValue e = throw_errno(ctx, "readFile", path); JS_FreeCString(ctx, path); return e; }
	JS_FreeCString(ctx, path);
	JSValue v = JS_NewStringLen(ctx, buf, len);
	free(buf);
	return v;
}

static JSValue js_write_file(JSContext *ctx, JSValueConst this, int argc, JSValueConst *argv) {
	(void) this;
	if (argc < 2) return JS_ThrowTypeError(ctx, "writeFile(path, data)");
	const char *path = JS_ToCString(ctx, argv[0]);
	if (!path) return JS_EXCEPTION;
	size_t len;
	const char *data = JS_ToCStringLen(ctx, &len, argv[1]);
	if (!data) { JS_FreeCString(ctx, path); return JS_EXCEPTION; }
	FILE *f = fopen(path, "wb");
	int ok = f && fwrite(data, 1, len, f) == len;
	if (f && fclose(f) != 0) ok = 0;
	JSValue r = ok ? JS_UNDEFINED : throw_errno(ctx, "writeFile", path);
	JS_FreeCString(ctx, data);
	JS_FreeCString(ctx, path);
	return r;
}

static void print_exception(JSContext *ctx) {
	JSValue e = JS_GetException(ctx);
	const char *s = JS_ToCString(ctx, e);
	fprintf(stderr, "%s\n", s ? s : "uncaught exception");
	if (s) JS_FreeCString(ctx, s);
	if (JS_IsError(ctx, e)) {
		JSValue st = JS_GetPropertyStr(ctx, e, "stack");
		if (!JS_IsUndefined(st)) {
			const char *t = JS_ToCString(ctx, st);
			if (t) { fputs(t, stderr); JS_FreeCString(ctx, t); }
		}
		JS_FreeValue(ctx, st);
	}
	JS_FreeValue(ctx, e);
	fflush(stderr);
}

int main(int argc, char **argv) {
	const char *code = NULL, *file = NULL;
	int first = 0;
	if (argc >= 3 && strcmp(argv[1], "-e") == 0) {
		code = argv[2];
		first = 3;
	} else if (argc >= 2 && argv[1][0] != '-') {
		file = argv[1];
		first = 2;
	} else {
		fprintf(stderr, "usage: qjs -e CODE [ARG...] | qjs FILE [ARG...]\n");
		return 2;
	}
	JSRuntime *rt = JS_NewRuntime();
	if (!rt) { fprintf(stderr, "qjs: out of memory\n"); return 70; }
	/* Below the 1 MiB the linker gives the C stack: deep recursion is a
	 * JavaScript RangeError, not a trap. */
	JS_SetMaxStackSize(rt, 640 * 1024);
	JSContext *ctx = JS_NewContext(rt);
	if (!ctx) { fprintf(stderr, "qjs: out of memory\n"); return 70; }

	JSValue g = JS_GetGlobalObject(ctx);
	JS_SetPropertyStr(ctx, g, "print", JS_NewCFunction(ctx, js_stdout, "print", 1));
	JS_SetPropertyStr(ctx, g, "readFile", JS_NewCFunction(ctx, js_read_file, "readFile", 1));
	JS_SetPropertyStr(ctx, g, "writeFile", JS_NewCFunction(ctx, js_write_file, "writeFile", 2));
	JSValue con = JS_NewObject(ctx);
	JS_SetPropertyStr(ctx, con, "log", JS_NewCFunction(ctx, js_stdout, "log", 1));
	JS_SetPropertyStr(ctx, con, "info", JS_NewCFunction(ctx, js_stdout, "info", 1));
	JS_SetPropertyStr(ctx, con, "debug", JS_NewCFunction(ctx, js_stdout, "debug", 1));
	JS_SetPropertyStr(ctx, con, "error", JS_NewCFunction(ctx, js_stderr, "error", 1));
	JS_SetPropertyStr(ctx, con, "warn", JS_NewCFunction(ctx, js_stderr, "warn", 1));
	JS_SetPropertyStr(ctx, g, "console", con);
	JSValue args = JS_NewArray(ctx);
	for (int i = first; i < argc; i++)
		JS_SetPropertyUint32(ctx, args, (uint32_t) (i - first), JS_NewString(ctx, argv[i]));
	JS_SetPropertyStr(ctx, g, "scriptArgs", args);
	JS_FreeValue(ctx, g);

	char *src = NULL;
	size_t len;
	const char *name = "-e";
	if (file) {
		src = read_file(file, &len);
		if (!src) { fprintf(stderr, "qjs: %s: %s\n", file, strerror(errno)); return 2; }
		name = file;
	} else {
		len = strlen(code);
	}
	/* JS_Eval wants a NUL after the source. */
	char *buf = malloc(len + 1);
	if (!buf) { fprintf(stderr, "qjs: out of memory\n"); return 70; }
	memcpy(buf, file ? src : code, len);
	buf[len] = 0;
	free(src);
	JSValue v = JS_Eval(ctx, buf, len, name, JS_EVAL_TYPE_GLOBAL);
	free(buf);
	int rc = 0;
	if (JS_IsException(v)) { print_exception(ctx); rc = 1; }
	JS_FreeValue(ctx, v);
	/* Run pending promise jobs so async code completes. */
	JSContext *jc;
	for (;;) {
		int r = JS_ExecutePendingJob(rt, &jc);
		if (r == 0) break;
		if (r < 0) { print_exception(jc); rc = 1; break; }
	}
	fflush(stdout);
	return rc;
}
