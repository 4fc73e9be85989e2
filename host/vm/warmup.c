/* warmup: walk a running VM through a task's paths without running task
 * code (pool_warm_up). Here, in the vm room, because both the snapshot
 * maker (snapshot.c) and the warm pool (host/run/pool.c) use it. */
#include "vm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "clock.h"
#include "proto.h"

/* Wait for a frame of type want (skipping STDOUT/STDERR of the warm-up). */
static int expect(struct vm *vm, uint8_t want, int64_t deadline, struct kiln_err *err)
{
	for (;;) {
		struct proto_frame f;

		if (vm_recv(vm, &f, deadline, err) < 0)
			return -1;
		if (f.type == want)
			return 0;
		if (f.type != PROTO_STDOUT && f.type != PROTO_STDERR)
			return kiln_err_set(err, KERR_VM_ERROR, "pool warm-up: frame 0x%02x instead of 0x%02x", f.type, want);
	}
}

/* Walk a VM through everything a task does: SETUP, a FILE on the root disk,
 * an EXEC of /bin/true as the task user, a COLLECT, and WARM (the pre-started
 * interpreter runs that file, the sample, through its own task path in a
 * throw-away fork). No task code runs here. */
int pool_warm_up(struct vm *vm, struct kiln_err *err)
{
	/* What a small task does: imports, prints to both streams, writes a
	 * file (in /tmp: /output must stay empty for the task). */
	static const char sample[] = "import json, os, sys\n"
				     "print(json.dumps({'k': [1, 2.5, None]}))\n"
				     "sys.stderr.write('e\\n')\n"
				     "with open('/tmp/.kiln-warm', 'w') as f:\n"
				     "    f.write('1')\n"
				     "os.unlink('/tmp/.kiln-warm')\n";
	static __thread uint8_t buf[4096];
	struct proto_file file = { .mode = 0644, .size = sizeof(sample) - 1 };
	struct proto_exec *e;
	ssize_t n;
	int64_t deadline = clock_mono_ms() + 60000;

	if (vm_setup(vm, deadline, err) < 0)
		return -1;

	snprintf(file.path, sizeof(file.path), "/kiln/warm/main.py");
	n = proto_file_encode(buf, sizeof(buf), &file);
	if (n < 0 || vm_send(vm, PROTO_FILE, buf, (size_t)n, deadline, err) < 0 ||
	    vm_send(vm, PROTO_FILE_DATA, sample, file.size, deadline, err) < 0 || expect(vm, PROTO_OK, deadline, err) < 0)
		return -1;

	e = calloc(1, sizeof(*e));
	if (!e)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	e->output_cap = 4096;
	e->uid = e->gid = 1000;
	snprintf(e->cwd, sizeof(e->cwd), "/work");
	e->argc = 1;
	e->argv[0] = "true";
	e->envc = 1;
	e->env[0] = "PATH=/usr/bin:/bin";
	n = proto_exec_encode(buf, sizeof(buf), e);
	free(e);
	if (n < 0 || vm_send(vm, PROTO_EXEC, buf, (size_t)n, deadline, err) < 0 ||
	    expect(vm, PROTO_STARTED, deadline, err) < 0 || expect(vm, PROTO_EXIT, deadline, err) < 0)
		return -1;

	{
		struct proto_writer w = { .buf = buf, .cap = sizeof(buf) };

		proto_put_u64(&w, 0);
		if (vm_send(vm, PROTO_COLLECT, buf, w.len, deadline, err) < 0)
			return -1;
	}
	for (;;) {
		struct proto_frame f;

		if (vm_recv(vm, &f, deadline, err) < 0)
			return -1;
		if (f.type == PROTO_OUT_END)
			break;
		if (f.type != PROTO_OUT_DIR && f.type != PROTO_OUT_FILE && f.type != PROTO_OUT_DATA)
			return kiln_err_set(err, KERR_VM_ERROR, "pool warm-up: unexpected frame 0x%02x in COLLECT", f.type);
	}
	if (vm_send(vm, PROTO_WARM, NULL, 0, deadline, err) < 0 || expect(vm, PROTO_OK, deadline, err) < 0)
		return -1;
	return 0;
}
