-- 0. round trip: the floor of any call, and so of a replay
SELECT 1;
