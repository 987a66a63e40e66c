/*
 * A message handler in C: passes every record through unchanged and adds a header
 * "handled-by: c" (after the record's own headers).
 *
 *   cc -shared -fPIC -I include -o libc_handler.so examples/c-handler/handler.c
 *   mirror-maker ... --message.handler ./libc_handler.so
 *
 * The args name the header value (default "c"). A record may have any number of headers
 * (Kafka sets no limit): the handler keeps one buffer per instance, grown when a record has
 * more headers than any before it, so a record costs no allocation once the buffer is large
 * enough. Header names are bytes and are copied as they are (Kafka does not require UTF-8).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mirror_maker_plugin.h"

#ifndef ABI_VERSION
#define ABI_VERSION MM_PLUGIN_ABI_VERSION
#endif

struct handler {
    char value[64];
    size_t value_len;
    /* The output headers: the record's own and ours; room for `capacity` of them. */
    mm_header *headers;
    size_t capacity;
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
    size_t needed = in->header_count + 1;
    if (needed > h->capacity) {
        size_t capacity = h->capacity ? h->capacity : 16;
        while (capacity < needed) {
            if (capacity > SIZE_MAX / 2 / sizeof(mm_header)) {
                set_error(err, "too many headers to copy");
                return 1;
            }
            capacity *= 2;
        }
        mm_header *grown = realloc(h->headers, capacity * sizeof(mm_header));
        if (!grown) {
            set_error(err, "out of memory for the record's headers");
            return 1;
        }
        h->headers = grown;
        h->capacity = capacity;
    }
    mm_header *headers = h->headers;
    if (in->header_count > 0) memcpy(headers, in->headers, in->header_count * sizeof(mm_header));
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

static void destroy(void *instance) {
    struct handler *h = instance;
    free(h->headers);
    free(h);
}

static const mm_handler_vtable VTABLE = {
    .abi_version = ABI_VERSION,
    .struct_size = sizeof(mm_handler_vtable),
    .init = init,
    .handle = handle,
    .destroy = destroy,
};

const mm_handler_vtable *mirror_maker_message_handler(void) { return &VTABLE; }
