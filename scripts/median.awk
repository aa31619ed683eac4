# Shared by the measuring scripts (chain.sh, scale.sh, tail.sh, tls.sh, types.sh): each
# prepends this to its own program. A run is a line whose first field
# names its setup; setup[i] and val[i, column] hold run i.
# ms converts a duration Go printed (µs, ms or s) to milliseconds.
function ms(d) { if (d ~ /µs$/) return d / 1000; if (d ~ /ms$/) return d + 0; if (d ~ /s$/) return d * 1000; return d }
# median is the median of column col over the runs of setup name.
function median(name, col,   n, i, j, t, v) {
  n = 0; for (i = 1; i <= runs; i++) if (setup[i] == name) v[++n] = val[i, col]
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
  return v[int((n + 1) / 2)]
}
