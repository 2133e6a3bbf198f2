/*-------------------------------------------------------------------------
 *
 * workflow.h
 *		Workflow runs and their steps, and idem_call(), which reaches them.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/workflow/workflow.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKFLOW_H
#define IDEM_WORKFLOW_H

#include "request/request.h"

/* run.c: workflow steps, also for idem_call() */
extern void idem_step_key_request(const char *run_id, const char *step,
								  IdemRequest *req);
extern void idem_step_request(IdemRequest *req, const char *run_id,
							  const char *step, IdemResult *result);

#endif							/* IDEM_WORKFLOW_H */
