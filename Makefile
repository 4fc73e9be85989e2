# kiln: one non-recursive Makefile, everything built under build/.
#   make            binaries: build/kiln, build/kiln-api, build/kiln-host, build/kiln-init (+ initramfs)
#   make image      guest kernel and the built-in templates' root filesystems (cached in $(KILN_CACHE))
#   make check      the layering and map checks, unit tests and fuzz corpus replay: no root, no VMs, well under a minute
#   make test       deps, then check, then integration tests with real VMs
#   make bench      benchmarks (figures, not pass/fail)
#   make demo       an example task, end to end
#   make install    binaries, console, helper scripts, kernel, initramfs and example configs under $(DESTDIR)$(PREFIX) and /etc/kiln
#   make deb        build/kiln_<VERSION>_amd64.deb (dpkg-deb; docs/operations.md)
#   make install-images, make deb-images   the built-in root images (make image): installed, or kiln-images_<VERSION>_amd64.deb
# Knobs: WERROR=0, SANITIZE=address,undefined, KILN_CACHE=/var/cache/kiln, PREFIX=/usr/local, DESTDIR=

B          := build
KILN_CACHE ?= /var/cache/kiln
export KILN_CACHE

# The version, from one place: VERSION, plus the commit when this tree is a
# git checkout (a tarball has no .git: the plain VERSION, even unpacked inside
# another repository). Only lib/version.c sees it; build/version.txt changes
# (and version.o rebuilds) only when it does.
VERSION      := $(shell cat VERSION)
GIT_HASH     := $(shell [ -e .git ] && git rev-parse --short HEAD 2>/dev/null)
KILN_VERSION := $(VERSION)$(if $(GIT_HASH),+g$(GIT_HASH))

CC       ?= gcc
WERROR   ?= 1
SANITIZE ?=
CFLAGS   := -std=gnu11 -O2 -g -Wall -Wextra -Wshadow -Wno-unused-parameter -Wno-format-truncation \
            -D_GNU_SOURCE -Ilib -Ijail -I/usr/include/postgresql -MMD -MP -ffile-prefix-map=$(CURDIR)=.
ifeq ($(WERROR),1)
CFLAGS   += -Werror
endif
ifneq ($(SANITIZE),)
CFLAGS   += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
LDFLAGS  += -fsanitize=$(SANITIZE)
endif
HOST_LIBS := -lnftables -lmnl -lseccomp -ljansson -lcurl -lcrypto -lmicrohttpd -lgnutls -lzstd -lz -lpthread
API_LIBS  := -ljansson -lcurl -lcrypto -lmicrohttpd -lgnutls -lsqlite3 -lpq -lhttp_parser -lpthread -lm
CLI_LIBS  := -ljansson -lcurl -lcrypto -larchive

LIB_SRCS   := $(wildcard lib/*.c)
LIB_OBJS   := $(LIB_SRCS:%.c=$(B)/%.o)
# kiln-host's rooms (host/ROOM/), listed top first: the order they link in.
# Each is a static library with one public header; which room may include
# which is host/LAYERS, checked by scripts/layers.py. host/main.c is kiln-host.
HOST_ROOMS := cmd serve template_build session task template run envd net vm
HOST_ROOM_LIBS := $(foreach r,$(HOST_ROOMS),$(B)/host/$(r)/libkiln-host-$(r).a)
# Tests, fuzzers and benchmarks include the rooms' headers by bare name.
HOST_INC   := -Ihost $(addprefix -Ihost/,$(HOST_ROOMS))
# The jail module is part of the host library (vm.c calls it); jail/main.c is kiln-jail.
JAIL_SRCS  := $(filter-out jail/main.c,$(wildcard jail/*.c))
HOST_SRCS  := $(foreach r,$(HOST_ROOMS),$(wildcard host/$(r)/*.c)) $(JAIL_SRCS)
HOST_OBJS  := $(HOST_SRCS:%.c=$(B)/%.o)
# kiln-api's rooms (api/ROOM/), listed top first: the order they link in.
# Each is a static library with one public header; which room may include
# which is api/LAYERS, checked by scripts/layers.py. api/main.c is kiln-api.
API_ROOMS  := http ports sessions templates scheduler base hostcall store
API_ROOM_LIBS := $(foreach r,$(API_ROOMS),$(B)/api/$(r)/libkiln-api-$(r).a)
# Tests, fuzzers and benchmarks include the rooms' headers by bare name.
API_INC    := -Iapi $(addprefix -Iapi/,$(API_ROOMS))
API_SRCS   := $(foreach r,$(API_ROOMS),$(wildcard api/$(r)/*.c))
API_OBJS   := $(API_SRCS:%.c=$(B)/%.o)
# kiln (the CLI and `kiln up`): its commands are a library; cli/main.c is the binary.
CLI_SRCS   := $(filter-out cli/main.c,$(wildcard cli/*.c))
CLI_OBJS   := $(CLI_SRCS:%.c=$(B)/%.o)
# kiln-init is static and links only what the guest needs (no jansson/libcrypto).
GUEST_SRCS := $(wildcard guest/*.c) lib/proto.c lib/eproto.c lib/io.c
GUEST_OBJS := $(GUEST_SRCS:%.c=$(B)/guest-obj/%.o)

UNIT_SRCS  := $(wildcard tests/unit/test_*.c)
UNIT_BINS  := $(UNIT_SRCS:tests/unit/%.c=$(B)/tests/unit/%)
FUZZ_SRCS  := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS  := $(FUZZ_SRCS:tests/fuzz/%.c=$(B)/tests/fuzz/%)

.PHONY: all deps image check tree-check test unit bench bench-bins demo fuzz clean install install-images deb deb-images FORCE
all: $(B)/kiln $(B)/kiln-api $(B)/kiln-host $(B)/kiln-jail $(B)/kiln-init $(B)/image/initramfs.cpio

deps:
	@scripts/deps.sh

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(B)/version.txt: FORCE
	@mkdir -p $(B)
	@echo '$(KILN_VERSION)' | cmp -s - $@ || echo '$(KILN_VERSION)' > $@
$(B)/lib/version.o $(B)/fuzz-obj/lib/version.o: $(B)/version.txt
$(B)/lib/version.o: CFLAGS += -DKILN_VERSION='"$(KILN_VERSION)"'
$(B)/fuzz-obj/lib/version.o: FUZZ_CFLAGS += -DKILN_VERSION='"$(KILN_VERSION)"'

$(B)/guest-obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DKILN_GUEST -c $< -o $@

$(B)/libkiln.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

# A room's objects include other rooms' doors as "ROOM/ROOM.h".
$(B)/host/%.o: CFLAGS += -Ihost

# One archive per room (build/host/ROOM/libkiln-host-ROOM.a), which kiln-host
# links top room first; libkiln-host.a holds them all (and the jail module)
# for the tests, fuzzers and benchmarks.
define host_room
$(B)/host/$(1)/libkiln-host-$(1).a: $$(patsubst %.c,$(B)/%.o,$$(wildcard host/$(1)/*.c))
	@rm -f $$@
	ar rcs $$@ $$^
endef
$(foreach r,$(HOST_ROOMS),$(eval $(call host_room,$(r))))

$(B)/libkiln-jail.a: $(JAIL_SRCS:%.c=$(B)/%.o)
	@rm -f $@
	ar rcs $@ $^

$(B)/libkiln-host.a: $(HOST_OBJS)
	@rm -f $@
	ar rcs $@ $^

# A room's objects include other rooms' doors as "ROOM/DOOR.h", as in host/.
$(B)/api/%.o: CFLAGS += -Iapi

# One archive per room (build/api/ROOM/libkiln-api-ROOM.a), which kiln-api
# links top room first; libkiln-api.a holds them all for the tests,
# fuzzers and benchmarks.
define api_room
$(B)/api/$(1)/libkiln-api-$(1).a: $$(patsubst %.c,$(B)/%.o,$$(wildcard api/$(1)/*.c))
	@rm -f $$@
	ar rcs $$@ $$^
endef
$(foreach r,$(API_ROOMS),$(eval $(call api_room,$(r))))

$(B)/libkiln-api.a: $(API_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(B)/libkiln-cli.a: $(CLI_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(B)/kiln: $(B)/cli/main.o $(B)/libkiln-cli.a $(B)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $^ $(CLI_LIBS)

$(B)/kiln-api: $(B)/api/main.o $(API_ROOM_LIBS) $(B)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $^ $(API_LIBS)

$(B)/kiln-host: $(B)/host/main.o $(HOST_ROOM_LIBS) $(B)/libkiln-jail.a $(B)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $^ $(HOST_LIBS)

$(B)/kiln-jail: $(B)/jail/main.o $(B)/libkiln-host.a $(B)/libkiln.a
	$(CC) $(LDFLAGS) -o $@ $^ -lseccomp -lcrypto

$(B)/kiln-init: $(GUEST_OBJS)
	$(CC) -static -o $@ $^

# The initramfs holds only kiln-init (as /init); it mounts the root disk itself.
$(B)/image/initramfs.cpio: $(B)/kiln-init
	@mkdir -p $(B)/image/initramfs
	cp $< $(B)/image/initramfs/init
	cd $(B)/image/initramfs && echo init | cpio --quiet -o -H newc -R 0:0 > ../initramfs.cpio

# The built-in templates: rootfs.ext4 is `default`, rootfs-NAME.ext4 the others.
image: deps
	@image/build-kernel.sh $(B)/image/vmlinux
	@image/build-rootfs.sh $(B)/image/rootfs.ext4 default
	@image/build-rootfs.sh $(B)/image/rootfs-python-data.ext4 python-data
	@image/build-rootfs.sh $(B)/image/rootfs-code-interpreter.ext4 code-interpreter

$(B)/tests/unit/%: tests/unit/%.c $(B)/libkiln-cli.a $(B)/libkiln-api.a $(B)/libkiln-host.a $(B)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $(HOST_INC) $(API_INC) -Icli -o $@ $(filter %.c %.a,$^) -lcmocka $(HOST_LIBS) $(API_LIBS) -larchive

# Fuzzers: clang + libFuzzer + ASan/UBSan over the project's own sources,
# compiled once into an archive (fuzzer-no-link: coverage without a second
# main) that every fuzzer links, instead of once per fuzzer.
FUZZ_CFLAGS := -std=gnu11 -g -O1 -D_GNU_SOURCE -Ilib -Ijail $(HOST_INC) $(API_INC) -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_OBJS   := $(patsubst %.c,$(B)/fuzz-obj/%.o,$(LIB_SRCS) $(HOST_SRCS))
$(B)/fuzz-obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(B)/libkiln-fuzz.a: $(FUZZ_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(B)/tests/fuzz/%: tests/fuzz/%.c $(B)/libkiln-fuzz.a
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(B)/libkiln-fuzz.a $(HOST_LIBS)

# kiln-api's request parsers need none of the host code.
$(B)/tests/fuzz/fuzz_apireq: tests/fuzz/fuzz_apireq.c $(B)/fuzz-obj/api/base/request.o $(B)/fuzz-obj/api/store/quota.o $(B)/libkiln-fuzz.a
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(B)/fuzz-obj/api/base/request.o $(B)/fuzz-obj/api/store/quota.o $(B)/libkiln-fuzz.a $(HOST_LIBS) -lm

# kiln-api's parsers of a request for an inline artifact (path, Range, signature).
$(B)/tests/fuzz/fuzz_artifacts: tests/fuzz/fuzz_artifacts.c $(B)/fuzz-obj/api/http/artifacts.o $(B)/libkiln-fuzz.a
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(B)/fuzz-obj/api/http/artifacts.o $(B)/libkiln-fuzz.a $(HOST_LIBS)

# The web console's path check (api/http/ui.c).
$(B)/tests/fuzz/fuzz_uiname: tests/fuzz/fuzz_uiname.c $(B)/fuzz-obj/api/http/ui.o $(B)/libkiln-fuzz.a
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(B)/fuzz-obj/api/http/ui.o $(B)/libkiln-fuzz.a $(HOST_LIBS)

# The E2B control API's input parsers (and kiln's session request parser after them).
$(B)/tests/fuzz/fuzz_e2breq: tests/fuzz/fuzz_e2breq.c $(B)/fuzz-obj/api/sessions/e2b_request.o $(B)/fuzz-obj/api/base/request.o $(B)/fuzz-obj/api/store/quota.o $(B)/libkiln-fuzz.a
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(B)/fuzz-obj/api/sessions/e2b_request.o $(B)/fuzz-obj/api/base/request.o $(B)/fuzz-obj/api/store/quota.o $(B)/libkiln-fuzz.a $(HOST_LIBS) -lm

# A sandbox server's HTTP answer as kiln-api's port proxy reads it.
$(B)/tests/fuzz/fuzz_portresp: tests/fuzz/fuzz_portresp.c $(B)/fuzz-obj/api/ports/port_resp.o $(B)/libkiln-fuzz.a
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(B)/fuzz-obj/api/ports/port_resp.o $(B)/libkiln-fuzz.a $(HOST_LIBS) -lhttp_parser

# The code interpreter's event lines as kiln-api's code API reads them.
$(B)/tests/fuzz/fuzz_codeev: tests/fuzz/fuzz_codeev.c $(B)/fuzz-obj/api/ports/port_code_ev.o $(B)/libkiln-fuzz.a
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(B)/fuzz-obj/api/ports/port_code_ev.o $(B)/libkiln-fuzz.a $(HOST_LIBS)

# POST /v1/sessions/{id}/code's body as kiln-api checks it.
$(B)/tests/fuzz/fuzz_codereq: tests/fuzz/fuzz_codereq.c $(B)/fuzz-obj/api/ports/port_code_ev.o $(B)/libkiln-fuzz.a
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(B)/fuzz-obj/api/ports/port_code_ev.o $(B)/libkiln-fuzz.a $(HOST_LIBS)

# kiln mcp's message handling (the CLI's pure protocol module).
$(B)/tests/fuzz/fuzz_mcp: tests/fuzz/fuzz_mcp.c $(B)/fuzz-obj/cli/mcp_proto.o $(B)/libkiln-fuzz.a
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -Icli -fsanitize=fuzzer -o $@ $< $(B)/fuzz-obj/cli/mcp_proto.o $(B)/libkiln-fuzz.a $(HOST_LIBS)

# Benchmarks: C drivers over the real host code, and the busybox baseline guest.
BENCH_SRCS := $(wildcard bench/*.c)
BENCH_BINS := $(BENCH_SRCS:bench/%.c=$(B)/bench/%)
$(B)/bench/%: bench/%.c bench/bench.h $(B)/libkiln-host.a $(B)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $(HOST_INC) -o $@ $(filter %.c %.a,$^) $(HOST_LIBS)
# bench/api_*.c drive kiln-api's modules (the store) instead.
$(B)/bench/api_%: bench/api_%.c $(B)/libkiln-api.a $(B)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $(API_INC) -o $@ $(filter %.c %.a,$^) $(API_LIBS)

# Built by make check and make test too, so that a change to what they use
# cannot break make bench unnoticed.
bench-bins: $(BENCH_BINS)

$(B)/bench/baseline.cpio: bench/baseline-init
	@mkdir -p $(B)/bench/baseline/bin
	cp bench/baseline-init $(B)/bench/baseline/init
	cp /bin/busybox $(B)/bench/baseline/bin/busybox
	cd $(B)/bench/baseline && printf 'init\nbin\nbin/busybox\n' | cpio --quiet -o -H newc -R 0:0 > ../baseline.cpio

# The guest agent on the host, for tests/agent/agent_host.py (no VM needed).
AGENT_DRIVE_SRCS := tests/agent/drive.c $(filter-out guest/main.c,$(wildcard guest/*.c)) lib/proto.c lib/eproto.c lib/io.c
$(B)/tests/agent-drive: $(AGENT_DRIVE_SRCS) $(wildcard guest/*.h lib/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DKILN_GUEST -Iguest -o $@ $(AGENT_DRIVE_SRCS)

# envd's unit test links the guest's own sources (built for the host), not
# the host libraries: it serves envd in a child over a socketpair.
ENVD_TEST_SRCS := guest/envd.c guest/envd_port.c guest/envd_proc.c guest/envd_tx.c guest/envd_fs.c guest/envd_watch.c guest/inq.c guest/execpath.c guest/init.c lib/proto.c lib/eproto.c lib/io.c
$(B)/tests/unit/test_envd: tests/unit/test_envd.c $(ENVD_TEST_SRCS) $(wildcard guest/*.h lib/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -DKILN_GUEST -Iguest -o $@ tests/unit/test_envd.c $(ENVD_TEST_SRCS) -lcmocka

# S3 driver over lib/s3.c for tests/integration/50-s3.sh and measurements.
$(B)/tests/s3tool: tests/s3/s3tool.c $(B)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.a,$^) $(HOST_LIBS)

# Looks at a live jail from the inside, for tests/integration/25-jail.sh.
$(B)/tests/jail-probe: tests/integration/jail_probe.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $<

# Tries io_uring inside kiln-jail, for tests/integration/28-hardening.sh (static: the jail has no libraries).
$(B)/tests/uring-probe: tests/integration/uring_probe.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -static -o $@ $<

# Runs kiln-host where process_vm_readv/writev are refused, for tests/integration/78-pause-diff.sh.
$(B)/tests/no-vm-readv: tests/integration/no_vm_readv.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< -lseccomp

# Boots a guest that floods its serial console, for tests/integration/27-console.sh.
$(B)/tests/console-flood: tests/integration/console_flood.c $(B)/libkiln-host.a $(B)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $(HOST_INC) -o $@ $(filter %.c %.a,$^) $(HOST_LIBS)

unit: $(B)/tests/console-flood $(UNIT_BINS) $(B)/tests/agent-drive $(B)/tests/jail-probe $(B)/tests/s3tool $(B)/tests/uring-probe $(B)/tests/no-vm-readv
fuzz: $(FUZZ_BINS)

# The tree's own rules: host/'s and api/'s includes follow host/LAYERS and
# api/LAYERS (scripts/layers.py), and docs/architecture.md's map names every
# product source file (scripts/map.py).
tree-check:
	@scripts/layers.py host
	@scripts/layers.py api
	@scripts/map.py

# What needs neither root nor VMs (a developer's inner loop; CI's first step).
check: tree-check all unit fuzz bench-bins
	@tests/run.sh check

# tests/run.sh all runs check's programs first, then the integration scripts,
# with one count at the end.
test: deps tree-check
	@$(MAKE) --no-print-directory all image unit fuzz bench-bins
	@tests/run.sh

bench: deps
	@$(MAKE) --no-print-directory all image $(BENCH_BINS) $(B)/bench/baseline.cpio
	@bench/run.sh

demo: deps
	@$(MAKE) --no-print-directory all image
	@scripts/demo.sh

# ---- install and package (docs/operations.md) ----
# Everything in bin/ (kiln up starts kiln-api and kiln-host from beside
# itself); the images under lib/kiln/image (arch-dependent; kiln-host looks
# there, lib/paths.c); the console, helper scripts and example configs
# under share/kiln; configuration in $(SYSCONFDIR)/kiln (an existing file is
# never replaced: `make install` over an edited api.json leaves it).
PREFIX       ?= /usr/local
DESTDIR      ?=
SYSCONFDIR   ?= /etc
UNITDIR      ?= $(PREFIX)/lib/systemd/system
BINDIR       := $(PREFIX)/bin
KILN_LIBDIR  := $(PREFIX)/lib/kiln
KILN_DATADIR := $(PREFIX)/share/kiln
DOCDIR       := $(PREFIX)/share/doc/kiln
UNITS        := kiln-api.service kiln-host.service

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(KILN_LIBDIR)/image $(DESTDIR)$(KILN_DATADIR)/ui \
		$(DESTDIR)$(KILN_DATADIR)/examples $(DESTDIR)$(DOCDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/kiln
	install -m 0755 $(B)/kiln $(B)/kiln-api $(B)/kiln-host $(B)/kiln-jail $(DESTDIR)$(BINDIR)/
	install -m 0644 $(B)/image/initramfs.cpio $(DESTDIR)$(KILN_LIBDIR)/image/
	@# The guest kernel when built (make image; 17 MB). The root images are
	@# install-images' (gigabytes: a package of their own, make deb-images).
	@if [ -e $(B)/image/vmlinux ]; then echo "install -m 0644 $(B)/image/vmlinux $(DESTDIR)$(KILN_LIBDIR)/image/"; \
		install -m 0644 $(B)/image/vmlinux $(DESTDIR)$(KILN_LIBDIR)/image/ || exit 1; \
	else echo "install: $(B)/image/vmlinux not built (make image): not installed"; fi
	install -m 0644 $(wildcard ui/*) $(DESTDIR)$(KILN_DATADIR)/ui/
	install -m 0755 scripts/s3-local.sh $(DESTDIR)$(KILN_DATADIR)/
	install -m 0644 packaging/etc/api.json packaging/etc/host.json $(DESTDIR)$(KILN_DATADIR)/examples/
	install -d $(DESTDIR)$(KILN_DATADIR)/monitoring
	install -m 0644 packaging/monitoring/kiln-alerts.yml packaging/monitoring/kiln-dashboard.json \
		$(DESTDIR)$(KILN_DATADIR)/monitoring/
	@for f in api.json host.json; do \
		if [ -e $(DESTDIR)$(SYSCONFDIR)/kiln/$$f ]; then echo "install: $(DESTDIR)$(SYSCONFDIR)/kiln/$$f exists: kept"; \
		else echo "install -m 0644 packaging/etc/$$f $(DESTDIR)$(SYSCONFDIR)/kiln/$$f"; \
			install -m 0644 packaging/etc/$$f $(DESTDIR)$(SYSCONFDIR)/kiln/$$f || exit 1; fi; \
	done
	for u in $(UNITS); do \
		sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' packaging/systemd/$$u.in > $(DESTDIR)$(UNITDIR)/$$u || exit 1; \
		chmod 0644 $(DESTDIR)$(UNITDIR)/$$u; \
	done
	install -m 0644 README.md docs/operations.md $(DESTDIR)$(DOCDIR)/

# build/kiln_<VERSION>_amd64.deb: `make install` into a staging root with
# PREFIX=/usr (units in /lib/systemd/system, as on Debian 12), Depends from
# dpkg-shlibdeps over the staged binaries plus the tools they run
# (packaging/deb/control.in), every file under /etc a conffile.
DEB      := $(B)/kiln_$(VERSION)_amd64.deb
DEB_ROOT := $(B)/deb/debian/kiln
deb: all
	rm -rf $(B)/deb $(DEB)
	@mkdir -p $(B)/deb/debian
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/$(DEB_ROOT) PREFIX=/usr UNITDIR=/lib/systemd/system > /dev/null
	install -d -m 0755 $(DEB_ROOT)/DEBIAN
	install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm $(DEB_ROOT)/DEBIAN/
	cd $(DEB_ROOT) && find etc -type f | sort | sed 's|^|/|' > DEBIAN/conffiles
	@# dpkg-shlibdeps wants a debian/control beside the staged package; it reads only its package names.
	printf 'Source: kiln\n\nPackage: kiln\nArchitecture: amd64\n' > $(B)/deb/debian/control
	cd $(B)/deb && dpkg-shlibdeps -O -edebian/kiln/usr/bin/kiln -edebian/kiln/usr/bin/kiln-api \
		-edebian/kiln/usr/bin/kiln-host -edebian/kiln/usr/bin/kiln-jail > shlibs.txt
	shlibs=$$(sed -n 's/^shlibs:Depends=//p' $(B)/deb/shlibs.txt); size=$$(du -sk --exclude=DEBIAN $(DEB_ROOT) | cut -f1); \
		sed -e 's|@VERSION@|$(VERSION)|' -e "s|@SHLIBS@|$$shlibs|" -e "s|@SIZE@|$$size|" \
		packaging/deb/control.in > $(DEB_ROOT)/DEBIAN/control
	dpkg-deb --root-owner-group --build $(DEB_ROOT) $(DEB)

# The built-in templates' root images (make image), copied sparse (each is
# mostly holes): kiln-host needs at least rootfs.ext4 beside the kernel.
install-images:
	@ls $(B)/image/rootfs*.ext4 > /dev/null 2>&1 || { echo "install-images: no root image built: run make image" >&2; exit 1; }
	install -d $(DESTDIR)$(KILN_LIBDIR)/image
	for f in $(B)/image/rootfs*.ext4; do \
		cp --sparse=always --dereference "$$f" $(DESTDIR)$(KILN_LIBDIR)/image/ && \
		chmod 0644 $(DESTDIR)$(KILN_LIBDIR)/image/$${f##*/} || exit 1; \
	done

# build/kiln-images_<VERSION>_all.deb: the root images as a package of their
# own (not part of kiln's: the three built-in ones hold 2.9 GB of data in
# 6.6 GB of ext4; zstd -1 packs them into 860 MB in 43 s here), for hosts
# that take them prebuilt. dpkg writes them whole (not sparse) on install.
DEB_IMAGES      := $(B)/kiln-images_$(VERSION)_amd64.deb
DEB_IMAGES_ROOT := $(B)/deb-images/kiln-images
deb-images:
	rm -rf $(B)/deb-images $(DEB_IMAGES)
	$(MAKE) --no-print-directory install-images DESTDIR=$(CURDIR)/$(DEB_IMAGES_ROOT) PREFIX=/usr
	install -d -m 0755 $(DEB_IMAGES_ROOT)/DEBIAN
	size=$$(du -sk --apparent-size --exclude=DEBIAN $(DEB_IMAGES_ROOT) | cut -f1); \
		sed -e 's|@VERSION@|$(VERSION)|' -e "s|@SIZE@|$$size|" packaging/deb/control-images.in \
		> $(DEB_IMAGES_ROOT)/DEBIAN/control
	dpkg-deb -Zzstd -z1 --root-owner-group --build $(DEB_IMAGES_ROOT) $(DEB_IMAGES)

clean:
	rm -rf $(B)

-include $(shell find $(B) -name '*.d' 2>/dev/null)
