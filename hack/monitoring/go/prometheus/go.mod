module ddpjob.io/monitoring/prometheus

go 1.26.7

require github.com/prometheus/prometheus v0.316.0
