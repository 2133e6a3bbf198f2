/*-------------------------------------------------------------------------
 *
 * untyped.c
 *		Driver parameters sent without a type next to typed ones: the parse
 *		analysis hook that gives them a type in calls of idem's functions.
 *
 * A driver that sends one argument typed (a decimal as numeric) and another
 * untyped (a string as type 0) reaches the VARIADIC "any" form of
 * idem_execute() and its siblings: the typed argument fits no idem_untyped[]
 * overload.  PostgreSQL leaves a Param of unknown type passed to "any"
 * unknown, and the extended protocol's Parse then fails with 42P18 ("could
 * not determine data type of parameter").  A literal in the same place
 * arrives as a C string of type unknown and is typed by the statement; a
 * parameter must be too.
 *
 * So after parse analysis, every unknown parameter passed to a function of
 * this extension is coerced to text through the parser's own parameter
 * coercion (the ParseState's p_coerce_param_hook, which is how the parser
 * itself settles a parameter's type from its first use), and so is every
 * other still unknown reference to the same parameter, so that all of them
 * agree as PostgreSQL's own check requires.  A text argument of those
 * functions is a string that the business statement types (execute.c), so
 * the driver's string becomes the value a literal would.  Other functions'
 * parameters are left alone: their 42P18 stays PostgreSQL's.
 *
 * The hook runs where the library is loaded when the statement is parsed:
 * by shared_preload_libraries or session_preload_libraries, or in a session
 * that called any idem function before.  A session's first statement is
 * parsed before it loads the library, so a client that relies on this
 * preloads it (doc/drivers.md).
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/untyped.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/dependency.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "nodes/nodeFuncs.h"
#include "parser/analyze.h"

#include "compat.h"
#include "request/request.h"

static post_parse_analyze_hook_type prev_post_parse_analyze_hook = NULL;

typedef struct UntypedWalk
{
	ParseState *pstate;
	Oid			extension;		/* idem's pg_extension OID, once looked up */
	Bitmapset  *typed;			/* paramids coerced to text */
} UntypedWalk;

static bool
is_unknown_param(Node *node)
{
	if (node != NULL && IsA(node, NamedArgExpr))
		node = (Node *) ((NamedArgExpr *) node)->arg;
	return node != NULL && IsA(node, Param) &&
		((Param *) node)->paramkind == PARAM_EXTERN &&
		((Param *) node)->paramtype == UNKNOWNOID;
}

static void
coerce_to_text(UntypedWalk *walk, Param *param)
{
	Node	   *done = walk->pstate->p_coerce_param_hook(walk->pstate, param,
														 TEXTOID, -1, -1);

	if (done != NULL)
		walk->typed = bms_add_member(walk->typed, param->paramid);
}

/* Whether funcid is a function of this extension. */
static bool
is_idem_function(UntypedWalk *walk, Oid funcid)
{
	if (!OidIsValid(walk->extension))
		walk->extension = get_extension_oid("idem", true);
	return OidIsValid(walk->extension) &&
		getExtensionOfObject(ProcedureRelationId, funcid) == walk->extension;
}

static bool
type_call_args(Node *node, UntypedWalk *walk)
{
	if (node == NULL)
		return false;
	if (IsA(node, Query))
		return query_tree_walker((Query *) node, type_call_args, walk, 0);
	if (IsA(node, FuncExpr))
	{
		FuncExpr   *fexpr = (FuncExpr *) node;
		ListCell   *lc;
		bool		any = false;

		foreach(lc, fexpr->args)
			any |= is_unknown_param(lfirst(lc));
		if (any && is_idem_function(walk, fexpr->funcid))
		{
			foreach(lc, fexpr->args)
			{
				Node	   *arg = lfirst(lc);

				if (IsA(arg, NamedArgExpr))
					arg = (Node *) ((NamedArgExpr *) arg)->arg;
				if (is_unknown_param(arg))
					coerce_to_text(walk, (Param *) arg);
			}
		}
	}
	return expression_tree_walker(node, type_call_args, walk);
}

/* The other references to a parameter typed above follow it. */
static bool
type_other_refs(Node *node, UntypedWalk *walk)
{
	if (node == NULL)
		return false;
	if (IsA(node, Query))
		return query_tree_walker((Query *) node, type_other_refs, walk, 0);
	if (is_unknown_param(node) && IsA(node, Param) &&
		bms_is_member(((Param *) node)->paramid, walk->typed))
		coerce_to_text(walk, (Param *) node);
	return expression_tree_walker(node, type_other_refs, walk);
}

/*
 * Whether the statement's text names something that begins with "idem_", in
 * any case: every function this hook is for does, and a statement that
 * names none is left without walking its tree.
 */
static bool
mentions_idem(const char *text)
{
	for (const char *p = text; (p = strpbrk(p, "iI")) != NULL; p++)
		if (pg_strncasecmp(p, "idem_", 5) == 0)
			return true;
	return false;
}

static void
untyped_post_parse_analyze(ParseState *pstate, Query *query,
						   JumbleState *jstate)
{
	UntypedWalk walk;

	if (prev_post_parse_analyze_hook)
		prev_post_parse_analyze_hook(pstate, query, jstate);

	/* only parameters whose types the parser settles can be unknown */
	if (pstate == NULL || pstate->p_coerce_param_hook == NULL ||
		pstate->p_paramref_hook == NULL || pstate->p_sourcetext == NULL ||
		!mentions_idem(pstate->p_sourcetext))
		return;

	walk.pstate = pstate;
	walk.extension = InvalidOid;
	walk.typed = NULL;
	(void) query_tree_walker(query, type_call_args, &walk, 0);
	if (walk.typed != NULL)
		(void) query_tree_walker(query, type_other_refs, &walk, 0);
	bms_free(walk.typed);
}

/*
 * idem_untyped_install
 *		Install the parse analysis hook; called once, when the library is
 *		loaded.
 */
void
idem_untyped_install(void)
{
	prev_post_parse_analyze_hook = post_parse_analyze_hook;
	post_parse_analyze_hook = untyped_post_parse_analyze;
}
