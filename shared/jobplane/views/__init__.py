"""Read views: what people are shown of jobs, from records and samples they are given (no I/O).

jobview.py     rows, table cells and status lines of jobs (`ls`, `describe`, `logs -f`, the dashboard)
metricview.py  a job's metric series, summaries and sparklines
cost.py        what jobs cost, estimated from the attempts job.json records and the prices
plot.py        a PNG of a job's metrics (`metrics --plot`)
notices.py     the message a job's end or idle GPUs send to the deployment's topic
"""
