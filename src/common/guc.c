/*-------------------------------------------------------------------------
 *
 * guc.c
 *		The variables behind idem's configuration parameters, with their
 *		boot values.  _PG_init() (idem.c) defines the parameters; every
 *		layer reads the variables, so they live at the bottom.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/guc.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/common.h"

int			idem_ttl = 86400;
int			idem_max_ttl = 30 * 86400;
bool		idem_wait = true;
int			idem_max_response_size = 1024 * 1024;
char	   *idem_outbox_topic = NULL;
int			idem_statement_cache_size = 256;
int			idem_statement_cache_memory = 32 * 1024;
bool		idem_durable_replay = false;
char	   *idem_cache_errors = NULL;
char	   *idem_key_owner_setting = NULL;
int			idem_outbox_max_attempts = 10;
int			idem_outbox_backoff_base = 1000;
int			idem_outbox_backoff_cap = 3600 * 1000;
bool		idem_outbox_jitter = true;
int			idem_outbox_max_lease = 3600;
int			idem_outbox_max_retry_after = 86400;
int			idem_outbox_retention = 7 * 86400;
bool		idem_outbox_logical_message = false;
int			idem_audit_level = IDEM_AUDIT_OFF;
int			idem_audit_retention = 0;
int			idem_audit_queue_size = 1024;
int			idem_purge_interval = 60;
int			idem_purge_batch_size = 10000;
bool		idem_outbox_notify = true;
char	   *idem_lease_token = NULL;
int			idem_run_max_lease = 3600;
