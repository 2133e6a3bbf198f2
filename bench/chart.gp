# Bar chart of the benchmark's median TPS, one panel per synchronous_commit
# setting.  Called by run.sh with these variables set:
#   files     data files, space-separated; each line: "workload" median min max
#   settings  the synchronous_commit value of each file, space-separated
#   outfile   the PNG to write
#   sub1, sub2  two lines describing the machine and the run
set terminal pngcairo size 1100,(words(files) > 1 ? 840 : 480) font "sans,10"
set output outfile
set multiplot layout words(files),1 title "idem benchmark: median TPS, pgbench -M prepared (idem in orange)\n".sub1."\n".sub2 noenhanced
set style fill solid 0.85 border -1
set boxwidth 0.7
set grid ytics
set format y "%.0s%c"
set ylabel "transactions/s"
unset key
color(name) = (strstrt(name, "idem") > 0 || strstrt(name, "hot") > 0) ? 0xE07020 : 0x5078A8
do for [i = 1:words(files)] {
	f = word(files, i)
	s = word(settings, i)
	set title "synchronous\\_commit = ".s.(s eq "off" ? " (CPU cost)" : " (durable commits)")
	stats f using 4 nooutput
	set yrange [0:STATS_max * 1.12]
	set xrange [-0.6:STATS_records - 0.4]
	plot f using 0:2:(color(strcol(1))):xtic(1) with boxes lc rgb variable, \
		 '' using 0:2:3:4 with yerrorbars lc rgb "black" pt -1, \
		 '' using 0:4:(sprintf("%.1fk", $2 / 1000.0)) with labels offset 0,0.7 font "sans,9"
}
unset multiplot
