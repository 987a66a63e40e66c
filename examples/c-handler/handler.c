/*
 * A message handler in C: passes every record through unchanged and adds a header
 * "handled-by: c" (after the record's own headers).
 *
 *   cc -shared -fPIC -I include -o libc_handler.so examples/c-handler/handler.c
 *   mirror-maker ... --message.handler ./libc_handler.so
 *
 * The args name the header value (default "c").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mirror_maker_plugin.h"

#ifndef ABI_VERSION
#define ABI_VERSION MM_PLUGIN_ABI_VERSION
#endif

#define MAX_HEADERS 64

struct handler {
    char value[64];
    size_t value_len;
};

static void set_error(mm_error_buf *err, const char *message) {
    size_t n = strlen(message);
    if (n > err->cap) n = err->cap;
    memcpy(err->ptr, message, n);
    err->len = n;
}

static int32_t init(mm_bytes args, void **instance, mm_error_buf *err) {
    if (args.len >= sizeof(((struct handler *)0)->value)) {
        set_error(err, "the header value must be shorter than 64 bytes");
        return 1;
    }
    struct handler *h = calloc(1, sizeof *h);
    if (!h) {
        set_error(err, "out of memory");
        return 1;
    }
    if (args.len == 0) {
        memcpy(h->value, "c", 1);
        h->value_len = 1;
    } else {
        memcpy(h->value, args.ptr, args.len);
        h->value_len = args.len;
    }
    *instance = h;
    return 0;
}

static int32_t handle(void *instance, const mm_record *in, mm_emit_fn emit, void *emit_ctx,
                      mm_error_buf *err) {
    struct handler *h = instance;
    mm_header headers[MAX_HEADERS + 1];
    if (in->header_count > MAX_HEADERS) {
        set_error(err, "more than 64 headers");
        return 1;
    }
    memcpy(headers, in->headers, in->header_count * sizeof(mm_header));
    headers[in->header_count].key = (mm_bytes){(const uint8_t *)"handled-by", 10};
    headers[in->header_count].value = (mm_bytes){(const uint8_t *)h->value, h->value_len};

    mm_record out = *in;
    out.partition = MM_ANY_PARTITION;
    out.headers = headers;
    out.header_count = in->header_count + 1;
    if (emit(emit_ctx, &out) != 0) {
        set_error(err, "the mirror refused the record");
        return 1;
    }
    return 0;
}

static void destroy(void *instance) { free(instance); }

static const mm_handler_vtable VTABLE = {
    .abi_version = ABI_VERSION,
    .struct_size = sizeof(mm_handler_vtable),
    .init = init,
    .handle = handle,
    .destroy = destroy,
};

const mm_handler_vtable *mirror_maker_message_handler(void) { return &VTABLE; }
