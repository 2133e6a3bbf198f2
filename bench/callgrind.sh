# Sourced by the benchmarks' --profile (bench/run.sh, bench/citus/run.sh).

# "Ir<TAB>function" of callgrind profile $1: inclusive costs, one line per
# function (its largest count), sorted by function
callgrind_inclusive() {
	callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
	awk '/^ *[0-9,]+ +\( *[0-9.]+%\) +/ { v = $1; gsub(",", "", v); f = $0
		sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, "", f); sub(/ \[.*$/, "", f)
		sub(/^.*\/src\//, "src/", f); print v "\t" f }' |
	sort -t "$(printf '\t')" -k2,2 -k1,1nr | awk -F'\t' '!seen[$2]++'
}
