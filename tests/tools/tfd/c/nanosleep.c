// nanosleep.c is tests/tools/tfd's C baseline: 200 sleeps of 100 ms, the CPU per wake-up
// and the switches from /proc/self/schedstat (README, Cost: "The timers on a
// timerfd: measured, not kept"). cc -O2 -o /tmp/cs nanosleep.c && /tmp/cs
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
static long long rd(long long *sw){FILE*f=fopen("/proc/self/schedstat","r");long long a,b,c;fscanf(f,"%lld %lld %lld",&a,&b,&c);fclose(f);*sw=c;return a;}
int main(){struct timespec ts={0,100000000};nanosleep(&ts,0);long long s0,s1;long long c0=rd(&s0);for(int i=0;i<200;i++)nanosleep(&ts,0);long long c1=rd(&s1);printf("C nanosleep: %.1f us/wake %.2f sw\n",(c1-c0)/1e3/200,(double)(s1-s0)/200);}
