import json,sys,collections,statistics as st,glob
for f in sorted(glob.glob('/work/ab-out/*/results.json')):
    res=json.load(open(f)); d=collections.defaultdict(list)
    for r in res['runs']:
        if r['mode']!='alone': d[(r['workload'],r['mode'])].append((round(r['daemon_cpu_pct'],1), round(sum(g['rate'] for g in r['per_guest'].values())/res['ideal'][r['workload']]*100) if res['ideal'].get(r['workload']) else None))
    print(f.split('/')[-2], dict(d))
