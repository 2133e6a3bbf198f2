/* idem--1.1--1.2.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idem UPDATE TO '1.2'" to load this file. \quit

-- A fresh installation of 1.2 runs idem--1.0.sql, idem--1.0--1.1.sql and
-- this script in turn: there is no separate full script to keep in step.
