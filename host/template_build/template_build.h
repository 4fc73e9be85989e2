/* template_build: turn a template recipe (a build VM) or an OCI archive (skopeo +
 * umoci in a jail) into a template root filesystem image: an ext4 file that
 * kiln-init can boot as a guest's root (docs/templates.md). Both run on the
 * calling thread, report progress line by line through log, and end early
 * (err "cancelled") once cancel_fd is readable. Neither uploads anything:
 * host/template_build/template_builds.c hashes, stores and publishes what they made.
 *
 * Room: the template_build room's door (host/template_build/: template builds from
 * recipes and OCI archives, and the build jobs kiln-host runs). It may call
 * the task, template, run, vm and net rooms, lib/ and jail/. template_builds.h,
 * included at the end, is part of this door. */
#ifndef KILN_TEMPLATE_BUILD_H
#define KILN_TEMPLATE_BUILD_H

#include <stdint.h>

#include <jansson.h>

#include "err.h"
#include "recipe.h"

struct run_opts;

/* What tasks of the template inherit. */
struct template_build_meta {
	json_t *env;          /* array of "K=V" strings (NULL: none); the caller decrefs */
	char workdir[4097];   /* "": tasks' default (/work) */
	uint32_t uid, gid;    /* the task user (recipe: 1000:1000) */
};

/* One line of build output (no newline; at most a few KiB, longer lines
 * are cut by the caller of log). Called on the building thread. */
typedef void (*template_build_log_fn)(void *ctx, const char *line);

struct template_build_recipe_req {
	const struct recipe *recipe;
	const char *base_rootfs;     /* the default template's image, never written */
	const struct run_opts *ro;   /* kernel, initramfs, accel, jail, run dir, egress (ro->net) */
	const char *mirror;          /* Debian mirror URL, e.g. http://deb.debian.org/debian */
	unsigned timeout_s;          /* the whole build */
	uint64_t max_bytes;          /* cap of the image made */
	unsigned vcpus, memory_mib;  /* of the build VM */
	int cancel_fd;               /* -1: none */
};

/* Boot a build VM from base_rootfs (a throw-away writable layer), reach only
 * the mirror, install the packages, take the VM off the network (nothing
 * after the packages reaches anything), write the files, run the steps as
 * root, write /etc/kiln/preload, clean apt's caches, and have the guest write a
 * fresh ext4 of its root into a second disk, which becomes out_ext4 (mode
 * 0444, at most max_bytes). 0, or -1 with err: build_failed (the message says
 * which step and how it ended), build_timeout, too_large, cancelled,
 * egress_disabled, or host errors. Leaves no VM, file or directory behind
 * but out_ext4. */
int template_build_recipe(const struct template_build_recipe_req *req, const char *out_ext4,
			  struct template_build_meta *meta, template_build_log_fn log, void *ctx, struct kiln_err *err);

struct template_build_oci_req {
	const char *archive;         /* docker-archive or OCI layout tar */
	const char *work_dir;        /* scratch directory (created; removed before return) */
	uint64_t max_bytes;          /* cap of the unpacked tree and of the image */
	unsigned timeout_s;
	int cancel_fd;               /* -1: none */
	const char *run_dir;         /* for the jail */
};

/* Unpack the image's layers (whiteouts honoured) in a jail, neutralise what
 * a root filesystem of kiln's must not hold (device nodes, set-uid/set-gid
 * bits, entries escaping the root), add the directories kiln-init needs, and
 * make out_ext4 (mode 0444). meta gets the image's Env, WorkingDir and User.
 * 0, or -1 with err: invalid_image (not an image, unsafe layer, unknown
 * user: the message says what), too_large, build_timeout, cancelled. */
int template_build_oci(const struct template_build_oci_req *req, const char *out_ext4, struct template_build_meta *meta,
	       template_build_log_fn log, void *ctx, struct kiln_err *err);

/* The rest of the door: the room's other modules other rooms use. */
#include "template_builds.h"

#endif
