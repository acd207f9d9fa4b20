/**
 * The run report page's browser side, inlined into `report.html` by report.ts: its stylesheet,
 * the plotting plan (pure helpers, also run in a VM by the tests) and the script that draws the
 * plots with uPlot and lists the trajectories.
 */
import { runInNewContext } from 'node:vm';

export const STYLE = `
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1240px;padding:16px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:2px}
nav a{margin-right:12px;color:#1f6feb}.meta{color:#666;margin:0 0 12px}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.controls{display:flex;gap:18px;align-items:center;flex-wrap:wrap;color:#444;font-size:13px;margin:4px 0 8px}
.controls input[type=range]{width:180px;vertical-align:middle}.key{display:inline-block;width:10px;height:10px;border-radius:50%;background:#e8590c;vertical-align:middle}
.group h3{font-size:15px;margin:18px 0 6px;color:#333}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(370px,1fr));gap:12px}
.plot{border:1px solid #e3e3e3;border-radius:6px;padding:6px 6px 2px;background:#fff;min-width:0}
.plot .title{font-size:13px;font-weight:600;margin:0 4px 2px;color:#333;overflow-wrap:anywhere}
.plot .u-legend{font-size:11px;line-height:1.2}.plot .u-legend .u-series>*{padding:1px 3px}
.traj{border:1px solid #ddd;border-radius:6px;margin:10px 0;padding:8px 12px;background:#fff}
.traj .head{display:flex;flex-wrap:wrap;gap:6px 12px;align-items:baseline;font-size:12px;color:#555}
.traj .head .src{font-weight:600;color:#333}.badge{border-radius:10px;padding:0 8px;font-weight:600;background:#eee;color:#333}
.badge.ok{background:#d3f9d8;color:#176f2c}.badge.bad{background:#ffe3e3;color:#b42318}
.traj .q{font-size:14px;font-weight:600;margin:6px 0 4px;white-space:pre-wrap;overflow-wrap:anywhere}
.traj .ga{display:grid;grid-template-columns:max-content 1fr;gap:2px 10px;font-size:13px;margin:2px 0 6px}
.traj .ga .k{color:#666}.traj .ga .v{white-space:pre-wrap;overflow-wrap:anywhere;font-family:ui-monospace,monospace}
.traj .facts{color:#555;font-size:12px;margin:2px 0 6px}.traj summary{cursor:pointer;color:#1f6feb;font-size:13px}
.msg{margin:6px 0;border-left:3px solid #ccc;padding-left:8px}.msg .role{font-weight:600;font-size:11px;text-transform:uppercase;letter-spacing:.04em;color:#555}
.msg pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;margin:2px 0;padding:6px 8px;font-size:12px;max-height:420px;overflow:auto}
.msg.assistant{border-color:#1f6feb}.msg.assistant pre{background:#eef5ff}.msg.user{border-color:#868e96}.msg.tool{border-color:#2f9e44}.msg.tool pre{background:#f0faf2}
.msg.system{border-color:#ced4da}.msg.system pre{color:#555}
.ok{color:#176f2c}.bad{color:#b42318}pre.config{background:#f7f7f7;padding:8px;overflow:auto}
`;

/**
 * The plotting plan, as plain functions (no closures over the page): which plots, in which group,
 * with which series, the EMA smoothing and the number format. The page runs this text; the tests
 * run the same text in a VM (see `reportHelpers`).
 */
const HELPERS = `
var GROUPS=[{id:'reward',title:'Reward and accuracy'},{id:'loss',title:'Losses'},{id:'kl',title:'KL, entropy, clipping'},{id:'length',title:'Lengths and turns'},{id:'timing',title:'Timing'},{id:'other',title:'Other'}];
var PALETTE=['#1f6feb','#2f9e44','#ae3ec9','#0c8599','#c2255c','#5f3dc4'];
var EVAL_COLOR='#e8590c';
var PREFERRED=['reward_mean','accuracy','answered','reward_std','loss','pg_loss','vf_loss','sft_loss','kl','kl_coef','entropy','clip_frac','pg_clipfrac','ratio_mean','response_tokens','sequence_tokens_mean','turns_mean','tool_turns_mean','tool_error_rate','tool_errors_mean','mask_coverage','time','grad_norm','lr'];
function groupOf(k){
  k=String(k).replace(/^eval_/,'');
  if(/^time_|(^|_)time_s$|_per_s$/.test(k))return 'timing';
  if(/^(reward|accuracy|answered|advantages?|em|f1|rouge|correct|returns|values_mean|explained_var)/.test(k))return 'reward';
  if(/(^|_)loss$/.test(k))return 'loss';
  if(/^(kl|entropy)|clip|^ratio/.test(k))return 'kl';
  if(/tokens|turns|length|^tool_|^sequences$|^episodes|mask_coverage/.test(k))return 'length';
  return 'other';
}
function rank(k){var i=PREFERRED.indexOf(k);return i<0?PREFERRED.length:i;}
function byRank(a,b){var d=rank(a.id)-rank(b.id);return d||(a.id<b.id?-1:a.id>b.id?1:0);}
/** The eval_* key's training counterpart, when the run logged one. */
function evalTarget(ek,keys){
  var s=ek.replace(/^eval_/,'');
  var c=[s,'reward/'+s,s+'_mean',s==='avg_turns'?'turns_mean':''];
  for(var i=0;i<c.length;i++)if(c[i]&&keys[c[i]])return c[i];
  return null;
}
/** Plots from metrics.jsonl rows: one per metric (X_min/X_mean/X_max together, the time_*_s phases together), eval rows as points on their training plot. */
function planPlots(rows){
  var byStep={},eByStep={};
  rows.forEach(function(r){if(!r||typeof r.step!=='number'||!isFinite(r.step))return;var m=r.kind==='eval'?eByStep:byStep;m[r.step]=Object.assign(m[r.step]||{},r);});
  var num=function(v){return typeof v==='number'&&isFinite(v);};
  var keys={},ekeys={};
  Object.keys(byStep).forEach(function(s){var r=byStep[s];for(var k in r)if(k!=='step'&&k!=='epoch'&&num(r[k]))keys[k]=1;});
  Object.keys(eByStep).forEach(function(s){var r=eByStep[s];for(var k in r)if(k!=='step'&&num(r[k]))ekeys[k]=1;});
  var plots={},used={};
  function plot(id,title){return plots[id]||(plots[id]={id:id,title:title,group:groupOf(id),train:[],evals:[]});}
  Object.keys(keys).forEach(function(k){
    var m=/^(.*)_(min|mean|max)$/.exec(k);
    if(m&&(keys[m[1]+'_min']||keys[m[1]+'_max'])&&keys[m[1]+'_mean']){var p=plot(m[1],m[1]+' (mean, min, max)');p.train.push({key:k,label:m[2],dash:m[2]!=='mean'});return;}
    if(/^time_.*_s$/.test(k)){var tp=plot('time','time per phase (s)');tp.group='timing';tp.train.push({key:k,label:k==='time_step_s'?'whole step':k.replace(/^time_|_s$/g,'')});return;}
    plot(k,k).train.push({key:k,label:k});
  });
  Object.keys(ekeys).forEach(function(ek){
    var t=evalTarget(ek,keys),p=null;
    if(t)for(var id in plots)if(plots[id].train.some(function(s){return s.key===t;}))p=plots[id];
    if(!p){p=plot(ek,ek);if(p.group==='other')p.group='reward';}
    p.evals.push({key:ek,label:'eval '+ek.replace(/^eval_/,'')});
  });
  var order={mean:0,min:1,max:2};
  return Object.keys(plots).map(function(id){return plots[id];}).sort(byRank).map(function(p){
    p.train.sort(function(a,b){return (order[a.label]!==undefined&&order[b.label]!==undefined)?order[a.label]-order[b.label]:a.key<b.key?-1:a.key>b.key?1:0;});
    var xs={};
    p.train.forEach(function(s){for(var st in byStep)if(num(byStep[st][s.key]))xs[st]=1;});
    p.evals.forEach(function(s){for(var st in eByStep)if(num(eByStep[st][s.key]))xs[st]=1;});
    var x=Object.keys(xs).map(Number).sort(function(a,b){return a-b;});
    var series=p.train.map(function(s,i){return {key:s.key,label:s.label,color:PALETTE[i%PALETTE.length],dash:!!s.dash,eval:false,values:x.map(function(st){var r=byStep[st];return r&&num(r[s.key])?r[s.key]:null;})};})
      .concat(p.evals.map(function(s){return {key:s.key,label:s.label,color:EVAL_COLOR,dash:false,eval:true,values:x.map(function(st){var r=eByStep[st];return r&&num(r[s.key])?r[s.key]:null;})};}));
    return {id:p.id,title:p.title,group:p.group,x:x,series:series};
  }).filter(function(p){return p.x.length>0;});
}
/** Exponential moving average with TensorBoard's debiasing (the first points are not pulled to 0); gaps stay gaps. */
function ema(values,w){
  if(!(w>0))return values.slice();
  var acc=0,n=0;
  return values.map(function(v){if(v===null||v===undefined||!isFinite(v))return null;acc=acc*w+(1-w)*v;n++;return acc/(1-Math.pow(w,n));});
}
/** Numbers for people: ticks with the decimals their spacing needs, rounding noise (|v| below a millionth of the spacing, or 1e-12) shown as 0. */
function fmtNum(v,incr){
  if(v===null||v===undefined)return '-';
  if(typeof v!=='number')return String(v);
  if(!isFinite(v))return String(v);
  var a=Math.abs(v),step=incr&&isFinite(incr)&&incr>0?incr:0;
  if(a<(step?step*1e-6:1e-12))return '0';
  if(step){
    if(a>=1e6||step>=1e6)return (v/1e6).toFixed(decimals(step/1e6))+'M';
    if(a>=1e4&&step>=100)return (v/1e3).toFixed(decimals(step/1e3))+'k';
    if(step<1e-4){var e=Math.floor(Math.log10(a));return v.toExponential(Math.min(6,decimals(step/Math.pow(10,e))));}
    return v.toFixed(decimals(step));
  }
  if(a>=1e6||a<1e-3)return v.toExponential(2).replace(/\\.?0+e/,'e');
  return String(+v.toPrecision(4));
}
function decimals(step){for(var d=0;d<10;d++){var s=step*Math.pow(10,d);if(Math.abs(s-Math.round(s))<1e-6*Math.max(1,Math.abs(s)))return d;}return 10;}
`;

/** The page's script: draws the plots with uPlot and lists the trajectories from the JSON data block. */
export const SCRIPT = `(function(){
'use strict';
${HELPERS}
var data=JSON.parse(document.getElementById('report-data').textContent);
function h(tag,parent,text,cls){var e=document.createElement(tag);if(cls)e.className=cls;if(text!==undefined)e.textContent=text;if(parent)parent.appendChild(e);return e;}
var root=document.getElementById('plots'),smoothEl=document.getElementById('smoothing'),smoothOut=document.getElementById('smoothing-value');
var plan=planPlots(data.metrics),cards=[];
GROUPS.forEach(function(g){
  var ps=plan.filter(function(p){return p.group===g.id;});if(!ps.length)return;
  var sec=h('section',root,undefined,'group');sec.setAttribute('data-group',g.id);h('h3',sec,g.title);
  var grid=h('div',sec,undefined,'grid');
  ps.forEach(function(p){
    var card=h('div',grid,undefined,'plot');card.setAttribute('data-title',p.title);card.setAttribute('data-color',p.series[0].color);
    if(p.series.some(function(s){return s.eval;}))card.setAttribute('data-eval-color',EVAL_COLOR);
    h('div',card,p.title,'title');cards.push({p:p,holder:h('div',card),u:null});
  });
});
if(!plan.length)h('p',root,'No metrics to plot yet.');
var XINCRS=[1,2,5,10,20,25,50,100,200,250,500,1000,2000,2500,5000,10000,20000,50000,100000,200000,500000,1000000];
function tickValues(u,splits,ai,space,incr){return splits.map(function(v){return fmtNum(v,incr);});}
function axisSize(u,values){if(!values)return 40;var n=0;values.forEach(function(v){n=Math.max(n,String(v).length);});return Math.max(36,n*7+14);}
function legendValue(u,v){return fmtNum(v);}
/* uPlot's own range, except that a flat series (spread under 1e-3 of its level: a constant, or float noise such as a ratio of 1.0000003) gets +-5 % (or +-0.5 around 0) instead of a range of noise. */
function yRange(u,min,max){
  if(min===null||max===null||!isFinite(min)||!isFinite(max))return [0,1];
  var mid=(min+max)/2;
  if(max-min<=Math.abs(mid)*1e-3){var d=mid===0?0.5:Math.abs(mid)*0.05;min=mid-d;max=mid+d;}
  return uPlot.rangeNum(min,max,0.1,true);
}
function options(p,w,width){
  var series=[{label:'step',value:function(u,v){return v===null||v===undefined?'-':String(v);}}],cols=[p.x];
  var evalOnly=!p.series.some(function(s){return !s.eval;});
  p.series.forEach(function(s){
    if(s.eval){var e={label:s.label,stroke:EVAL_COLOR,width:1.5,spanGaps:true,points:{show:true,size:9,width:1,stroke:EVAL_COLOR,fill:EVAL_COLOR},value:legendValue};if(!evalOnly)e.paths=function(){return null;};series.push(e);cols.push(s.values);return;}
    var lw=s.dash?1:2,dash=s.dash?[5,4]:undefined;
    if(w>0){
      series.push({label:s.label+' (raw)',stroke:s.color+'4d',width:1,dash:dash,spanGaps:true,points:{show:false},value:legendValue});cols.push(s.values);
      series.push({label:s.label,stroke:s.color,width:lw,dash:dash,spanGaps:true,points:{show:false},value:legendValue});cols.push(ema(s.values,w));
    }else{series.push({label:s.label,stroke:s.color,width:lw,dash:dash,spanGaps:true,value:legendValue});cols.push(s.values);}
  });
  var axis={stroke:'#555',font:'11px system-ui,sans-serif',grid:{stroke:'#ececec',width:1},ticks:{stroke:'#cfcfcf',width:1,size:4},values:tickValues};
  return {opts:{width:width,height:190,scales:{x:{time:false},y:{range:yRange}},series:series,
    axes:[Object.assign({},axis,{incrs:XINCRS,size:30}),Object.assign({},axis,{size:axisSize})],
    legend:{show:true,live:true},cursor:{drag:{x:false,y:false}}},data:cols};
}
function draw(){
  var w=Number(smoothEl.value)||0;smoothOut.textContent=w>0?w.toFixed(2):'off';
  cards.forEach(function(c){
    if(c.u)c.u.destroy();c.holder.textContent='';
    var o=options(c.p,w,Math.max(240,c.holder.clientWidth));
    try{c.u=new uPlot(o.opts,o.data,c.holder);}catch(e){c.u=null;c.holder.textContent='';h('p',c.holder,'could not draw: '+e,'bad');console.error('plot '+c.p.title+': '+e);}
  });
  document.body.setAttribute('data-plots-drawn',String(cards.length));
  document.body.setAttribute('data-smoothing',String(w));
}
/* long noisy runs start smoothed (TensorBoard's 0.6), short ones raw */
if(plan.some(function(p){return p.x.length>=50;}))smoothEl.value='0.6';
smoothEl.addEventListener('input',draw);
var resizing=0;window.addEventListener('resize',function(){clearTimeout(resizing);resizing=setTimeout(draw,150);});
draw();
var list=document.getElementById('traj-list'),sel=document.getElementById('traj-source');
var sources=[];data.trajectories.forEach(function(t){if(sources.indexOf(t.source)<0)sources.push(t.source);});
sources.forEach(function(s){var o=h('option',sel,s);o.value=s;});
var ROLES=['system','user','assistant','tool'];
function show(){
  list.textContent='';var shown=0;
  data.trajectories.forEach(function(t,i){
    if(sel.value!=='*'&&t.source!==sel.value)return;shown++;
    var box=h('div',list,undefined,'traj');
    var head=h('div',box,undefined,'head');
    h('span',head,'#'+(i+1)+' '+t.source,'src');
    var good=t.correct!==undefined?t.correct:(t.reward!==null&&t.reward>0);
    h('span',head,'reward '+fmtNum(t.reward),'badge '+(t.reward===null?'':good?'ok':'bad'));
    if(t.correct!==undefined)h('span',head,t.correct?'correct':'wrong',t.correct?'ok':'bad');
    if(t.turns!==undefined)h('span',head,'turns '+t.turns);
    if(t.finish)h('span',head,'finish '+t.finish);
    if(t.temperature!==undefined)h('span',head,'temperature '+fmtNum(t.temperature));
    if(t.advantage!==undefined)h('span',head,'advantage '+fmtNum(t.advantage));
    h('div',box,t.question,'q');
    var ga=h('div',box,undefined,'ga');
    h('span',ga,'gold','k');h('span',ga,t.golds.join(' | '),'v');
    h('span',ga,'answer','k');h('span',ga,t.answer===null?'(none)':t.answer,'v '+(t.correct===undefined?'':t.correct?'ok':'bad'));
    if(t.parts){var extra=[];for(var k in t.parts)extra.push(k+' '+fmtNum(t.parts[k]));if(extra.length)h('div',box,'reward parts: '+extra.join(' · '),'facts');}
    var det=h('details',box);if(shown===1)det.open=true;
    h('summary',det,'conversation: '+t.messages.length+' messages');
    t.messages.forEach(function(m){
      var role=ROLES.indexOf(m.role)>=0?m.role:'other';
      var d=h('div',det,undefined,'msg '+role);h('div',d,m.role,'role');h('pre',d,m.content);
    });
  });
  if(!shown)h('p',list,'No trajectories in this run folder.');
  document.body.setAttribute('data-trajectories-shown',String(shown));
}
sel.addEventListener('change',show);show();
})();`;

/** The pure plotting helpers of the page, evaluated in a VM (for tests). */
// biome-ignore lint/suspicious/noExplicitAny: the page's helpers, called from the page's own script with its values.
export function reportHelpers(): Record<string, (...a: any[]) => any> {
  return runInNewContext(`${HELPERS};({groupOf:groupOf,planPlots:planPlots,ema:ema,fmtNum:fmtNum,GROUPS:GROUPS})`);
}
