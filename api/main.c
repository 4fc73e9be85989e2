/* kiln-api: the public HTTP API of kiln (docs/api.md, "kiln-api"). Loads the
 * configuration, opens the store, serves until SIGINT/SIGTERM. */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "fsutil.h"
#include "http/server.h"
#include "s3.h"
#include "scheduler/scheduler.h"
#include "sessions/sessions.h"
#include "store/store.h"
#include "templates/templates.h"
#include "version.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: kiln-api [--config FILE] [--listen ADDR:PORT] [--db FILE]\n"
		   "       kiln-api migrate [--config FILE] [--db FILE]\n"
		   "       kiln-api check-config FILE\n"
		   "       kiln-api --version\n"
		   "  Serves the kiln API; see README \"kiln-api configuration\". migrate brings the\n"
		   "  store's schema (SQLite or PostgreSQL) to this version and exits. check-config\n"
		   "  checks what FILE would use (store, TLS, S3, ...) without serving: exit 0 when\n"
		   "  fine, 1 with one line per problem.\n");
}

static void on_submitted(void *ctx)
{
	sched_wake(ctx);
}

/* A cancel of a placed task: forward it now (the scheduler's periodic pass
 * over store_tasks_cancel_pending retries when the host cannot be reached). */
static void on_cancel(void *ctx, const char *task_id)
{
	sched_wake_full(ctx);
}

/* Another replica's change (PostgreSQL): a task queued or cancelled there is
 * this scheduler's business too. */
static void on_remote_change(void *ctx, const char *id, const char *event, json_t *data)
{
	const char *state = json_string_value(json_object_get(data, "state"));

	if (!strcmp(event, "state") && state && !strcmp(state, "queued"))
		sched_wake(ctx);
	else if (!strcmp(event, "cancel") || !strcmp(event, "resync"))
		sched_wake_full(ctx);
}

static void on_destination_changed(void *ctx, const char *customer)
{
	sched_destination_changed(ctx, customer);
}

/* kiln-api check-config FILE: the real loader, then server_check_config. */
static int cmd_check_config(int argc, char **argv)
{
	struct kiln_err err = { .code = "" };
	struct api_config cfg;
	int problems;

	if (argc != 2 || argv[1][0] == '-') {
		usage(stderr);
		return 2;
	}
	/* The settings (stdout) and the problems (stderr) stay in order when
	 * both go to one terminal or file. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (api_config_load(argv[1], &cfg, &err) < 0) {
		fprintf(stderr, "error: %s\nkiln-api: %s: 1 problem(s)\n", err.message, argv[1]);
		return 1;
	}
	problems = server_check_config(&cfg, argv[1]);
	api_config_free(&cfg);
	return problems ? 1 : 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, 0, 'c' }, { "listen", required_argument, 0, 'l' },
		{ "db", required_argument, 0, 'd' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	const char *config_path = NULL, *listen = NULL, *db = NULL;
	struct kiln_err err = { .code = "" };
	struct api_config cfg;
	struct store *st;
	struct server *srv;
	struct sched *sched;
	struct sessions *sessions;
	struct templates *templates;
	sigset_t set;
	int opt, sig, migrate = 0;

	if (argc > 1 && !strcmp(argv[1], "check-config"))
		return cmd_check_config(argc - 1, argv + 1);
	if (argc == 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version"))) {
		printf("kiln-api %s\n", kiln_version());
		return 0;
	}
	if (argc > 1 && !strcmp(argv[1], "migrate")) {
		migrate = 1;
		argv[1] = argv[0];
		argc--;
		argv++;
	}
	while ((opt = getopt_long(argc, argv, "c:l:d:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			config_path = optarg;
			break;
		case 'l':
			listen = optarg;
			break;
		case 'd':
			db = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	if (config_path) {
		if (api_config_load(config_path, &cfg, &err) < 0) {
			fprintf(stderr, "kiln-api: %s\n", err.message);
			return 2;
		}
	} else {
		api_config_defaults(&cfg);
	}
	if (listen)
		cfg.listen = listen;
	if (db)
		cfg.db = db;
	if (migrate) {
		int r = store_migrate_only(cfg.postgres ? cfg.postgres : cfg.db, cfg.postgres != NULL, &err);

		if (r < 0)
			fprintf(stderr, "kiln-api: migrate: %s\n", err.message);
		else
			fprintf(stderr, "kiln-api: migrate: %s is at schema version %d\n",
				cfg.postgres ? "postgresql" : cfg.db, STORE_SCHEMA_VERSION);
		api_config_free(&cfg);
		return r < 0 ? 3 : 0;
	}
	if (!cfg.admin_key)
		fprintf(stderr, "kiln-api: warning: no admin_key configured: nobody can create customers or keys\n");

	/* Signals are taken synchronously below (sigwait). */
	fs_daemon_start(&set);

	st = cfg.postgres ? store_open_pg(cfg.postgres, &err) : store_open(cfg.db, &err);
	if (!st) {
		fprintf(stderr, "kiln-api: %s\n", err.message);
		goto out_cfg;
	}
	if (store_leader_start(st) < 0) {
		fprintf(stderr, "kiln-api: cannot start the leader election\n");
		goto out_store;
	}
	srv = server_start(&cfg, st, NULL, &err);
	if (!srv) {
		fprintf(stderr, "kiln-api: %s\n", err.message);
		goto out_store;
	}
	s3_global_init(); /* curl: presigning needs none, the scheduler's host client does */
	hostclient_set_ca(cfg.hosts_ca_file); /* before anything calls a host */
	{
		struct sched_config sc = {
			.cluster_token = cfg.cluster_token,
			.host_lost_after_ms = cfg.host_lost_after_s * 1000,
			.relay = server_relay_event,
			.dest_key = cfg.have_dest_key ? cfg.dest_key : NULL,
			.relay_ctx = srv,
			.host = &host_ops_hostclient,
			.clock = &clock_system,
		};

		sched = sched_start(st, &sc, &err);
		if (!sched) {
			fprintf(stderr, "kiln-api: %s\n", err.message);
			goto out_server;
		}
		server_set_hooks(srv, &(struct server_hooks){ .submitted = on_submitted, .cancel_requested = on_cancel,
							     .destination_changed = on_destination_changed, .ctx = sched });
		store_set_remote_hook(st, on_remote_change, sched);
	}
	sessions = sessions_start(&cfg, st, sched, &host_ops_hostclient, &clock_system, &err);
	if (!sessions) {
		fprintf(stderr, "kiln-api: %s\n", err.message);
		goto out_sched;
	}
	server_set_sessions(srv, sessions);
	templates = templates_create(&cfg, st, sched, &host_ops_hostclient, &clock_system, &err);
	if (!templates || templates_start(templates) < 0) {
		fprintf(stderr, "kiln-api: %s\n", templates ? "cannot start the template builder" : err.message);
		templates_free(templates);
		server_set_sessions(srv, NULL);
		sessions_stop(sessions);
		goto out_sched;
	}
	server_set_templates(srv, templates);
	if (!cfg.cluster_token)
		fprintf(stderr, "kiln-api: warning: no cluster_token configured: no host can register\n");
	fprintf(stderr, "kiln-api: serving on http://%s (db %s, S3 %s)\n", cfg.listen,
		cfg.postgres ? "postgresql" : cfg.db,
		cfg.s3.endpoint ? cfg.s3.endpoint : "none: outputs get no url");
	if (cfg.tls_listen)
		fprintf(stderr, "kiln-api: serving TLS on %s (%s; SIGHUP reads it again)\n", cfg.tls_listen,
			cfg.tls_cert_file);
	for (;;) {
		struct kiln_err rerr = { .code = "" };

		if (sigwait(&set, &sig) != 0)
			continue;
		if (sig != SIGHUP)
			break;
		if (server_reload(srv, &rerr) < 0)
			fprintf(stderr, "kiln-api: SIGHUP: %s (the running certificate stays)\n", rerr.message);
		else if (cfg.tls_listen)
			fprintf(stderr, "kiln-api: SIGHUP: TLS certificate read again from %s\n", cfg.tls_cert_file);
	}
	fprintf(stderr, "kiln-api: %s: shutting down\n", strsignal(sig));
	server_set_hooks(srv, NULL);
	/* HTTP threads still running see no sessions from here on; the reaper
	 * stops before the scheduler it asks about hosts. */
	server_set_sessions(srv, NULL);
	/* The builder and its followers stop; HTTP threads may still read
	 * (their streams end): the module is freed after the server. */
	server_set_templates(srv, NULL);
	templates_stop(templates);
	if (sessions_stop(sessions) < 0) {
		/* A session request (a long exec, a pause) is still talking to its
		 * host: everything that matters is committed in the store, so exit
		 * now rather than free what that request uses or wait for it. */
		fprintf(stderr, "kiln-api: session requests still in flight: exiting without waiting for them\n");
		return 0;
	}
	store_set_remote_hook(st, NULL, NULL);
	sched_stop(sched);
	server_stop(srv);
	templates_free(templates);
	store_close(st);
	api_config_free(&cfg);
	return 0;

	/* A start that failed: undo what was started, in reverse order. */
out_sched:
	server_set_hooks(srv, NULL);
	store_set_remote_hook(st, NULL, NULL);
	sched_stop(sched);
out_server:
	server_stop(srv);
out_store:
	store_close(st);
out_cfg:
	api_config_free(&cfg);
	return 3;
}
