/*
 * mirror-maker plugin ABI, version 1.
 *
 * A plugin is a shared library exporting one entry symbol:
 *   const mm_handler_vtable  *mirror_maker_message_handler(void);     (--message.handler)
 *   const mm_listener_vtable *mirror_maker_rebalance_listener(void);  (--consumer.rebalance.listener)
 * returning a pointer to a static vtable with abi_version = MM_PLUGIN_ABI_VERSION and
 * struct_size = sizeof(the vtable). A library with another version or size is refused at
 * start-up (exit 2), as is one whose init returns non-zero.
 *
 * Ownership: nothing allocated on one side is freed on the other.
 *   - Records, headers and partitions reach the plugin as borrowed views, valid only for the
 *     duration of the call.
 *   - A handler hands each output record to emit(emit_ctx, &record); the host copies it before
 *     emit returns, so the record may live on the plugin's stack.
 *   - Errors are written into the host's buffer with at most err->cap bytes of UTF-8; set
 *     err->len. Return non-zero to report the error.
 *
 * Threads: init is called once per mirror stream; an instance is used by one thread at a time
 * (possibly not the one that made it). destroy is called once per instance.
 *
 * Semantics: a handler that emits nothing filters the record out (it counts as acknowledged);
 * a source record counts as acknowledged once every record emitted from it is. A non-zero
 * return from handle, or from a listener callback, stops the mirror (exit 1) after committing
 * what was acknowledged; the record being handled is not committed.
 */
#ifndef MIRROR_MAKER_PLUGIN_H
#define MIRROR_MAKER_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MM_PLUGIN_ABI_VERSION 1u
#define MM_NO_TIMESTAMP (-1)   /* timestamp: none */
#define MM_ANY_PARTITION (-1)  /* output partition: let the mirror choose (--partitioning) */

/* A byte string. ptr == NULL means absent (null key or value); len == 0 with a non-NULL ptr
 * means empty. */
typedef struct mm_bytes {
    const uint8_t *ptr;
    size_t len;
} mm_bytes;

typedef struct mm_header {
    mm_bytes key;   /* never NULL; UTF-8 */
    mm_bytes value; /* may be NULL */
} mm_header;

typedef struct mm_record {
    mm_bytes topic;          /* UTF-8; on output, the target topic */
    int32_t partition;       /* on output, MM_ANY_PARTITION or a target partition */
    int64_t offset;          /* source offset (input only) */
    mm_bytes key;
    mm_bytes value;
    const mm_header *headers;
    size_t header_count;
    int64_t timestamp;       /* milliseconds since the epoch, or MM_NO_TIMESTAMP */
} mm_record;

typedef struct mm_partition {
    mm_bytes topic;
    int32_t partition;
} mm_partition;

typedef struct mm_error_buf {
    uint8_t *ptr;
    size_t cap;
    size_t len;
} mm_error_buf;

/* Copies one output record into the mirror. Returns 0, or non-zero if it was refused. */
typedef int32_t (*mm_emit_fn)(void *emit_ctx, const mm_record *record);

typedef struct mm_handler_vtable {
    uint32_t abi_version; /* MM_PLUGIN_ABI_VERSION */
    uint32_t struct_size; /* sizeof(mm_handler_vtable) */
    int32_t (*init)(mm_bytes args, void **instance, mm_error_buf *err);
    int32_t (*handle)(void *instance, const mm_record *record, mm_emit_fn emit, void *emit_ctx,
                      mm_error_buf *err);
    void (*destroy)(void *instance);
} mm_handler_vtable;

typedef struct mm_listener_vtable {
    uint32_t abi_version; /* MM_PLUGIN_ABI_VERSION */
    uint32_t struct_size; /* sizeof(mm_listener_vtable) */
    int32_t (*init)(mm_bytes args, void **instance, mm_error_buf *err);
    /* After the mirror flushed and committed these partitions, before they are released. */
    int32_t (*before_releasing_partitions)(void *instance, const mm_partition *partitions,
                                           size_t count, mm_error_buf *err);
    /* After a new assignment, before any of its records is fetched. */
    int32_t (*before_starting_fetchers)(void *instance, mm_bytes consumer_id,
                                        const mm_partition *partitions, size_t count,
                                        mm_error_buf *err);
    void (*destroy)(void *instance);
} mm_listener_vtable;

#ifdef __cplusplus
}
#endif

#endif /* MIRROR_MAKER_PLUGIN_H */
